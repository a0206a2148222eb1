//! Builds what makes the cdylib a drop-in `libibverbs.so.1` and
//! `librdmacm.so.1` at once (one library, two names: see the crate's
//! README):
//!
//! - the version script, from the symbol lists of the rdma-core release the
//!   library stands in for (`abi/rdma-core-NN.symbols` and
//!   `abi/rdmacm-NN.symbols`, written by `gen-symbols` from the installed
//!   libraries; `RNIC_IBVERBS_SYMBOLS` names another verbs list, which is
//!   how a different IBVERBS_PRIVATE_NN is chosen);
//! - for every listed function the crate does not define, a stub that
//!   returns "not supported" (programs are linked BIND_NOW, so every symbol
//!   they and the libraries beside them import must resolve);
//! - a wrapper around `ld` that drops the version script rustc writes
//!   (with two scripts, rustc's anonymous one wins and every symbol comes out
//!   unversioned) and leaves a copy of the library named `libibverbs.so.1`
//!   in `target/<profile>/rnic-ibverbs/`, with `librdmacm.so.1` a symbolic
//!   link to it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::{env, fs};

/// Functions that return a pointer: their stub returns NULL (with errno
/// EOPNOTSUPP) rather than an error number.
const POINTER_RETURNING: &[&str] = &[
    "_verbs_init_and_alloc_context",
    "verbs_open_device",
    "ibv_import_device",
    "ibv_import_pd",
    "ibv_import_mr",
    "ibv_import_dm",
    "ibv_reg_dmabuf_mr",
    "ibv_create_ah_from_wc",
    "ibv_get_device_guid",
    "rdma_event_str",
    "rdma_create_event_channel",
    "rdma_get_devices",
];

/// The rdma_cm functions' stubs fail as librdmacm's functions fail: -1
/// with errno set (a 64-bit -1, which is -1 for callers that declared an
/// `int` and for those that declared a `ssize_t` or `off_t`, as rsockets'
/// `rsend` and `riomap` are).
fn rdmacm(name: &str) -> bool {
    name.starts_with("rdma_") || name.starts_with('r') && !name.starts_with("rdma")
}

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap());
    println!("cargo:rerun-if-env-changed=RNIC_IBVERBS_SYMBOLS");
    let list = env::var_os("RNIC_IBVERBS_SYMBOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("abi/rdma-core-44.symbols"));
    let cm_list = manifest.join("abi/rdmacm-44.symbols");

    // NAME VERSION KIND
    let mut by_version: BTreeMap<Version, Vec<(String, String)>> = BTreeMap::new();
    for list in [&list, &cm_list] {
        println!("cargo:rerun-if-changed={}", list.display());
        let text = fs::read_to_string(list)
            .unwrap_or_else(|e| panic!("reading the symbol list {}: {e}", list.display()));
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [name, version, kind] = f[..] else {
                panic!("{}: malformed line {line:?}", list.display());
            };
            by_version
                .entry(Version::parse(version))
                .or_default()
                .push((name.to_string(), kind.to_string()));
        }
    }

    let defined = defined_symbols(&manifest.join("src"));
    fs::write(out.join("libibverbs.map"), version_script(&by_version)).unwrap();
    fs::write(out.join("stubs.rs"), stubs(&by_version, &defined)).unwrap();

    // The linker wrapper: GNU ld (rustc's own lld would merge its script
    // with ours), found by gcc as `ld.bfd` in the -B directory.
    let wrap = out.join("ld-wrap");
    fs::create_dir_all(&wrap).unwrap();
    for name in ["ld.bfd", "ld"] {
        let ld = wrap.join(name);
        fs::write(&ld, LD_WRAPPER).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&ld, fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    println!("cargo:rustc-link-arg-cdylib=-fuse-ld=bfd");
    println!("cargo:rustc-link-arg-cdylib=-B{}", wrap.display());
    println!(
        "cargo:rustc-link-arg-cdylib=-Wl,--version-script={}",
        out.join("libibverbs.map").display()
    );
    println!("cargo:rustc-link-arg-cdylib=-Wl,-soname,libibverbs.so.1");
    println!("cargo:rerun-if-changed=src");
}

/// `IBVERBS_1.14` sorts after `IBVERBS_1.9`; private nodes after public
/// ones; each library's nodes (`IBVERBS`, `RDMACM`) together.
#[derive(PartialEq, Eq, PartialOrd, Ord, Clone)]
struct Version {
    family: String,
    private: bool,
    numbers: Vec<u32>,
    name: String,
}

impl Version {
    fn parse(name: &str) -> Version {
        let private = name.contains("PRIVATE");
        let tail = name.rsplit('_').next().unwrap_or("");
        let numbers = tail.split('.').filter_map(|n| n.parse().ok()).collect();
        Version {
            family: name.split('_').next().unwrap_or("").to_string(),
            private,
            numbers,
            name: name.to_string(),
        }
    }
}

/// Each library's public nodes form a chain, each inheriting the one
/// before; the private node stands alone, as in rdma-core's own maps.
fn version_script(by_version: &BTreeMap<Version, Vec<(String, String)>>) -> String {
    let mut s = String::new();
    let mut previous: Option<&str> = None;
    let mut family = "";
    for (v, syms) in by_version {
        if v.family != family {
            family = &v.family;
            previous = None;
        }
        writeln!(s, "{} {{\n  global:", v.name).unwrap();
        for (name, _) in syms {
            writeln!(s, "    {name};").unwrap();
        }
        let last = by_version.keys().next_back().map(|l| l.name.as_str()) == Some(&v.name);
        if last {
            s.push_str("  local: *;\n");
        }
        match (v.private, previous) {
            (false, Some(p)) => writeln!(s, "}} {p};").unwrap(),
            _ => s.push_str("};\n"),
        }
        if !v.private {
            previous = Some(&v.name);
        }
    }
    s
}

/// The names the crate exports itself: a `#[no_mangle]` line followed by a
/// `fn NAME(` or `static NAME:` line.
fn defined_symbols(src: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        let mut marked = false;
        for line in text.lines().map(str::trim) {
            if line == "#[no_mangle]" {
                marked = true;
                continue;
            }
            if marked {
                let name = line
                    .split_once(" fn ")
                    .or_else(|| line.split_once("static "))
                    .map(|(_, rest)| rest)
                    .and_then(|rest| rest.split(['(', ':', '<']).next());
                if let Some(n) = name {
                    names.insert(n.trim_start_matches("mut ").trim().to_string());
                }
            }
            marked = false;
        }
    }
    names
}

fn stubs(
    by_version: &BTreeMap<Version, Vec<(String, String)>>,
    defined: &BTreeSet<String>,
) -> String {
    let mut s = String::from(
        "// Generated by build.rs from the symbol list: the functions rnic does not\n\
         // provide. Each says so on stderr once and fails with EOPNOTSUPP.\n",
    );
    for (name, kind) in by_version.values().flatten() {
        if defined.contains(name) {
            continue;
        }
        assert!(
            kind == "FUNC",
            "the data object {name} must be defined by the crate (#[no_mangle] static)"
        );
        let pointer = POINTER_RETURNING.contains(&name.as_str());
        let (ret, fail) = if pointer {
            ("*mut core::ffi::c_void", "core::ptr::null_mut()")
        } else if rdmacm(name) {
            ("isize", "-1")
        } else {
            ("core::ffi::c_int", "libc::EOPNOTSUPP")
        };
        writeln!(
            s,
            "#[no_mangle]\npub extern \"C\" fn {name}() -> {ret} {{\n    \
             crate::unsupported(\"{name}\");\n    {fail}\n}}"
        )
        .unwrap();
    }
    s
}

const LD_WRAPPER: &str = r#"#!/bin/sh
# rnic-ibverbs' linker wrapper (written by build.rs): keep only rnic's version
# script, link, then leave a copy named libibverbs.so.1 beside the target's
# profile directory, in rnic-ibverbs/.
out=
prev=
for a do
    shift
    case $a in
    --version-script=*/libibverbs.map) ;;
    --version-script=*) prev=$a; continue ;;
    esac
    [ "$prev" = -o ] && out=$a
    prev=$a
    set -- "$@" "$a"
done
# Find the real linker of this name: the first on PATH that is not this script.
self_dir=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
name=$(basename -- "$0")
real=
IFS=:
for d in $PATH; do
    [ "$d" = "$self_dir" ] && continue
    if [ -x "$d/$name" ]; then real=$d/$name; break; fi
done
unset IFS
[ -n "$real" ] || { echo "rnic-ibverbs: no $name on PATH" >&2; exit 1; }
"$real" "$@" || exit $?
case $out in
*/deps/libibverbs.so)
    dir=$(dirname -- "$out")/../rnic-ibverbs
    mkdir -p "$dir" &&
    cp -f "$out" "$dir/.libibverbs.so.1.tmp$$" &&
    mv -f "$dir/.libibverbs.so.1.tmp$$" "$dir/libibverbs.so.1" &&
    ln -sfn libibverbs.so.1 "$dir/librdmacm.so.1"
    ;;
esac
"#;
