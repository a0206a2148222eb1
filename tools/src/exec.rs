//! `rnic exec -- PROGRAM ARGS...`: run an unmodified verbs program on rnic,
//! by putting rnic's drop-in `libibverbs.so.1` first on the loader's path.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the drop-in library is: `RNIC_LIBIBVERBS_DIR`, else the
/// `rnic-ibverbs` directory cargo's build leaves beside this executable.
pub fn library_dir() -> Result<PathBuf, String> {
    if let Some(d) = std::env::var_os("RNIC_LIBIBVERBS_DIR") {
        let d = PathBuf::from(d);
        return if d.join("libibverbs.so.1").is_file() {
            Ok(d)
        } else {
            Err(format!(
                "RNIC_LIBIBVERBS_DIR={}: no libibverbs.so.1 there",
                d.display()
            ))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new(".")).join("rnic-ibverbs");
    if dir.join("libibverbs.so.1").is_file() {
        Ok(dir)
    } else {
        Err(format!(
            "no {} (build it with `cargo build --release -p rnic-ibverbs`, or set RNIC_LIBIBVERBS_DIR)",
            dir.join("libibverbs.so.1").display()
        ))
    }
}

/// Replace this process with `program`, on rnic. Returns only on failure.
pub fn run(program: &OsString, args: &[OsString], devices: Option<&str>) -> String {
    let dir = match library_dir() {
        Ok(d) => d,
        Err(e) => return e,
    };
    // The device list the program will see: --devices, else the inherited
    // RNIC_DEVICES; checked here so that a mistake is reported before the
    // program starts.
    let inherited = std::env::var("RNIC_DEVICES").ok();
    if let Some(d) = devices.or(inherited.as_deref()) {
        if let Err(e) = ibverbs::parse_devices(d) {
            return e;
        }
    }
    if let Some(a) = std::env::var_os("RNIC_ADDR") {
        if let Err(e) = rnic_verbs::parse_env_addr("RNIC_ADDR", &a.to_string_lossy()) {
            return e.to_string();
        }
    }
    let mut path = OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut cmd = Command::new(program);
    cmd.args(args).env("LD_LIBRARY_PATH", path);
    if let Some(d) = devices {
        cmd.env("RNIC_DEVICES", d);
    }
    let e = cmd.exec();
    format!("{}: {e}", program.to_string_lossy())
}
