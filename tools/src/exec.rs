//! `rnic exec -- PROGRAM ARGS...`: run an unmodified verbs program on rnic,
//! by putting rnic's drop-in `libibverbs.so.1` first on the loader's path.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::sysfs;

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

/// Replace this process with `program`, on rnic (with `sysfs`, in a mount
/// namespace that shows its devices in /sys/class/infiniband). Returns only
/// on failure.
pub fn run(program: &OsString, args: &[OsString], devices: Option<&str>, sysfs: bool) -> String {
    let dir = match library_dir() {
        Ok(d) => d,
        Err(e) => return e,
    };
    // The device list the program will see: --devices, else the inherited
    // RNIC_DEVICES; checked here so that a mistake is reported before the
    // program starts.
    let inherited = std::env::var("RNIC_DEVICES").ok();
    let list = match devices.or(inherited.as_deref()).map(ibverbs::parse_devices) {
        Some(Ok(l)) => Some(l),
        Some(Err(e)) => return e,
        None => None,
    };
    let addr = match std::env::var_os("RNIC_ADDR") {
        Some(a) => match rnic_verbs::parse_env_addr("RNIC_ADDR", &a.to_string_lossy()) {
            Ok(a) => Some(a),
            Err(e) => return e.to_string(),
        },
        None => None,
    };
    let mut devices = devices.map(str::to_string);
    let iface = std::env::var("RNIC_IFACE").ok().filter(|i| !i.is_empty());
    if sysfs && list.is_none() && addr.is_none() {
        if let Some(name) = iface {
            // The default device on an interface: the interface's
            // addresses, its GID table, as the library will take them.
            let i = match rnic_verbs::frames::Interface::find(&name) {
                Ok(i) => i,
                Err(e) => return format!("--iface {name}: {e}"),
            };
            let devs = [sysfs::Dev {
                name: "rnic0",
                gids: i.gids,
            }];
            if let Err(e) = sysfs::enter(&devs) {
                return e;
            }
            return exec(program, args, &dir, None);
        }
    }
    if sysfs {
        // sysfs shows addresses, so the default device's is chosen here, the
        // way the library would choose it, and handed on in RNIC_DEVICES.
        let list = match list {
            Some(l) => l,
            // Claimed here and held across exec for the program's NIC:
            // programs started together never get the same address.
            None => match addr.map_or_else(rnic_verbs::reserve_loopback_for_exec, Ok) {
                Ok(a) => {
                    devices = Some(format!("rnic0={a}"));
                    vec![ibverbs::DeviceSpec {
                        name: "rnic0".into(),
                        addr: Some(a),
                    }]
                }
                Err(e) => return format!("--sysfs: {e}"),
            },
        };
        let devs: Vec<sysfs::Dev<'_>> = list
            .iter()
            .filter_map(|d| {
                Some(sysfs::Dev {
                    name: &d.name,
                    gids: vec![d.addr?],
                })
            })
            .collect();
        if let Err(e) = sysfs::enter(&devs) {
            return e;
        }
    }
    exec(program, args, &dir, devices)
}

/// Replace this process with `program`, the library in `dir` first on its
/// path, `devices` in RNIC_DEVICES if given. Returns only on failure.
fn exec(program: &OsString, args: &[OsString], dir: &Path, devices: Option<String>) -> String {
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
