//! The built library as the dynamic loader and a C program see it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/<profile>/rnic-ibverbs/libibverbs.so.1`, left by the linker
/// wrapper when cargo built the cdylib for this test run. It must be the
/// very library cargo just linked (`deps/libibverbs.so`): a copy left from
/// an earlier build, by a link that bypassed the wrapper, does not count.
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let lib = deps.parent().unwrap().join("rnic-ibverbs/libibverbs.so.1");
    assert!(lib.is_file(), "{} was not built", lib.display());
    let linked = deps.join("libibverbs.so");
    assert!(
        std::fs::read(&lib).unwrap() == std::fs::read(&linked).unwrap(),
        "{} is not the library cargo linked ({}): the linker wrapper did not run",
        lib.display(),
        linked.display()
    );
    lib
}

fn require(tool: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found && std::env::var_os("RNIC_REQUIRE_TOOLS").is_some() {
        panic!("{tool} is required (RNIC_REQUIRE_TOOLS is set)");
    }
    if !found {
        eprintln!("SKIPPED: {tool} is not installed");
    }
    found
}

#[test]
fn every_listed_symbol_is_exported_under_its_version_and_nothing_else() {
    if !require("readelf") {
        return;
    }
    let out = Command::new("readelf")
        .args(["--dyn-syms", "-W"])
        .arg(library())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut exported: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Num: Value Size Type Bind Vis Ndx Name
            (f.len() >= 8 && f[6] != "UND" && f[4] == "GLOBAL").then(|| f[7].to_string())
        })
        .collect();
    exported.sort();
    assert!(
        exported
            .iter()
            .any(|s| s == "ibv_get_device_list@@IBVERBS_1.1"),
        "ibv_get_device_list@@IBVERBS_1.1 missing: {exported:?}"
    );
    let list = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/abi/rdma-core-44.symbols"
    ))
    .unwrap()
        + &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/abi/rdmacm-44.symbols"
        ))
        .unwrap();
    let mut want: Vec<String> = list
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            format!("{}@@{}", f[0], f[1])
        })
        .collect();
    // The version nodes themselves appear as absolute symbols.
    exported.retain(|s| !s.starts_with("IBVERBS_") && !s.starts_with("RDMACM_"));
    want.sort();
    assert_eq!(exported, want);
    assert!(
        text.contains("verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34")
            && text.contains("OBJECT"),
        "the provider data object is exported as data"
    );
}

/// `librdmacm.so.1` beside the library is a link to it: a program that
/// needs both maps one file (the loader knows it by its inode), so the CM
/// and the verbs objects are one library's.
#[test]
fn librdmacm_is_the_same_library() {
    let lib = library();
    let cm = lib.with_file_name("librdmacm.so.1");
    assert_eq!(
        std::fs::canonicalize(&cm).unwrap(),
        std::fs::canonicalize(&lib).unwrap(),
        "{} is not {}",
        cm.display(),
        lib.display()
    );
}

#[test]
fn the_rdmacm_symbol_list_matches_the_installed_librdmacm() {
    let installed = Path::new("/usr/lib/x86_64-linux-gnu/librdmacm.so.1");
    if !installed.exists() {
        eprintln!("SKIPPED: no installed librdmacm.so.1 to compare with");
        return;
    }
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/gen-symbols"))
        .arg(installed)
        .output()
        .unwrap();
    assert!(out.status.success());
    let list = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/abi/rdmacm-44.symbols"
    ))
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), list);
}

#[test]
fn the_symbol_list_matches_the_installed_libibverbs() {
    let installed = Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so.1");
    if !installed.exists() {
        eprintln!("SKIPPED: no installed libibverbs.so.1 to compare with");
        return;
    }
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/gen-symbols"))
        .arg(installed)
        .output()
        .unwrap();
    assert!(out.status.success());
    let list = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/abi/rdma-core-44.symbols"
    ))
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        list,
        "the installed rdma-core exports another set: regenerate abi/ with gen-symbols \
         and build with RNIC_IBVERBS_SYMBOLS pointing at it"
    );
}

/// Build `tests/c/NAME.c` against the installed verbs.h; its path, or None
/// (skipped) where gcc or the header is missing.
fn build_c(name: &str) -> Option<PathBuf> {
    build_c_with(name, &["-libverbs"], "/usr/include/infiniband/verbs.h")
}

/// [`build_c`] linked with `libs`, skipped where `header` is missing.
fn build_c_with(name: &str, libs: &[&str], header: &str) -> Option<PathBuf> {
    if !require("gcc") {
        return None;
    }
    if !Path::new(header).exists() {
        assert!(
            std::env::var_os("RNIC_REQUIRE_TOOLS").is_none(),
            "{header} is required (RNIC_REQUIRE_TOOLS is set)"
        );
        eprintln!("SKIPPED: no {header} (libibverbs-dev, librdmacm-dev)");
        return None;
    }
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let st = Command::new("gcc")
        .args(["-Wall", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(format!("{}/tests/c/{name}.c", env!("CARGO_MANIFEST_DIR")))
        .args(libs)
        .status()
        .unwrap();
    assert!(st.success(), "gcc failed on {name}.c");
    Some(exe)
}

/// `exe` (a program `build_c` made) run on the library `lib`, given at
/// most 60 s.
fn c_program(exe: &Path, lib: &Path) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.arg("60")
        .arg(exe)
        .env("LD_LIBRARY_PATH", lib.parent().unwrap());
    cmd
}

/// A C program, built against the installed verbs.h, sees rnic's errors as
/// rdma-core defines them (tests/c/errors.c says which).
#[test]
fn error_paths_reach_a_c_program() {
    let Some(exe) = build_c("errors") else {
        return;
    };
    let lib = library();
    let out = c_program(&exe, &lib)
        // Its own device on loopback, away from other tests' default ones.
        .env("RNIC_DEVICES", "rnic0=127.0.0.201")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("all error paths as expected"), "{stdout}");
}

/// Every field of a completion a C program reads, per request type on RC,
/// UC and UD, success and the main errors; the blocking calls under
/// signals; one node GUID (tests/c/completions.c says which and why). Over
/// an IPv4 and an IPv6 address (UD's `sl` says which), and on the default
/// device, whose address is chosen rather than given.
#[test]
fn completions_read_as_rdma_rxe_and_mlx5_report_them() {
    let Some(exe) = build_c("completions") else {
        return;
    };
    let lib = library();
    for addr in ["127.0.0.206", "::1", "default"] {
        let mut cmd = c_program(&exe, &lib);
        cmd.env_remove("RNIC_ADDR").env_remove("RNIC_IFACE");
        if addr == "default" {
            cmd.env_remove("RNIC_DEVICES");
        } else {
            cmd.env("RNIC_DEVICES", format!("rnic0={addr}"));
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{addr}: {stdout}\n{stderr}");
        assert!(stdout.contains("all completions as expected"), "{stdout}");
    }
}

/// rdma_cm as a C program sees it through the drop-in librdmacm.so.1
/// (tests/c/cm.c says what): private data both ways, a reject with data
/// (status 28), a port nobody listens on (status 8), an address nobody
/// holds (ADDR_ERROR), the channel's descriptor, both sides disconnected,
/// and 100 connections that leave no descriptor behind.
#[test]
fn rdma_cm_reaches_a_c_program_as_librdmacm_defines_it() {
    let Some(exe) = build_c_with(
        "cm",
        &["-lrdmacm", "-libverbs"],
        "/usr/include/rdma/rdma_cma.h",
    ) else {
        return;
    };
    let lib = library();
    let out = c_program(&exe, &lib)
        .env_remove("RNIC_IFACE")
        .env("RNIC_DEVICES", "rnic0=127.0.0.207")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("rdma_cm as expected"), "{stdout}");
}

/// A ping-pong whose answering process returns from main right after
/// taking in the last request, destroying nothing, still acknowledges
/// that request (tests/c/exit_acks.c): its ACK, held for an answer that
/// never comes, leaves as the process exits.
#[test]
fn a_process_that_exits_acknowledges_what_it_took_in() {
    let Some(exe) = build_c("exit_acks") else {
        return;
    };
    let lib = library();
    // Three times: whether the ACK waits for an answer depends on what the
    // engine learned of the program by then (most runs, not all).
    for run in 0..3 {
        let out = c_program(&exe, &lib).arg("2000").output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "run {run}: {stdout}\n{stderr}");
        assert!(stdout.contains("last write acknowledged"), "{stdout}");
    }
}

/// RNIC_LOG reaches a C program's stderr: with it the engine's debug log
/// (its start, here) is there, without it not.
#[test]
fn rnic_log_reaches_a_c_program_s_stderr() {
    let Some(exe) = build_c("exit_acks") else {
        return;
    };
    let lib = library();
    let run = |log: Option<&str>| {
        let mut cmd = c_program(&exe, &lib);
        // Addresses of its own: the exit test runs the same program at
        // the same time on the default ones.
        cmd.args(["200", "127.0.0.204", "127.0.0.205"])
            .env("NO_COLOR", "1")
            .env_remove("RNIC_LOG");
        if let Some(l) = log {
            cmd.env("RNIC_LOG", l);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        stderr
    };
    let logged = run(Some("rnic_verbs=debug"));
    assert!(logged.contains("engine started"), "{logged}");
    assert!(!run(None).contains("engine started"));
}
