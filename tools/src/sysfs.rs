//! `rnic exec --sysfs`: the program sees its rnic devices in
//! `/sys/class/infiniband`, as it would see a RoCE port there.
//!
//! rdma-core's tests, NCCL and other frameworks read the GID table, the GID
//! types and the network device behind each GID from sysfs rather than
//! through verbs. rnic has no kernel device, so `rnic exec` builds that view
//! in a private mount namespace of the program:
//!
//! 1. `unshare(CLONE_NEWNS)` (as root; otherwise in a new user namespace
//!    too, where the program runs as uid 0 of that namespace), and every
//!    mount made private, so nothing done here reaches the host;
//! 2. a tmpfs over `/sys/class`, with each class that was there bound back
//!    in place (`/sys/class/net` and the rest stay the kernel's own);
//! 3. `/sys/class/infiniband/NAME/...` written for each device, with the
//!    entries a RoCE v2 port has and the values rnic's verbs report;
//! 4. the tmpfs made read-only, like sysfs.
//!
//! The rest of the filesystem is untouched, and the view ends with the
//! program.

use std::fs;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::Path;

use rustix::mount::{self, MountFlags, MountPropagationFlags};
use rustix::thread::UnshareFlags;

const CLASS: &str = "/sys/class";

/// A device as the program will see it.
pub struct Dev<'a> {
    /// Its name (`rnic0`).
    pub name: &'a str,
    /// Its GID table: the addresses, in the port's order (one on loopback).
    pub gids: Vec<IpAddr>,
}

/// Enter a private mount namespace whose `/sys/class/infiniband` lists
/// `devs`. Call it single-threaded, just before exec.
pub fn enter(devs: &[Dev<'_>]) -> Result<(), String> {
    private_namespace()?;
    let err = |what: &str, e: std::io::Error| format!("--sysfs: {what}: {e}");
    cover(
        CLASS,
        &["infiniband", "infiniband_verbs"],
        MountFlags::empty(),
    )
    .map_err(|e| err(CLASS, e))?;
    for d in devs {
        write_device(d).map_err(|e| err(d.name, e))?;
    }
    mount::mount_remount(CLASS, MountFlags::RDONLY, c"")
        .map_err(|e| err("make /sys/class read-only", e.into()))?;
    device_nodes(devs.len()).map_err(|e| format!("--sysfs: /dev/infiniband: {e}"))
}

/// Cover `dir` with a tmpfs of this namespace (mounted with `flags`) and
/// put back every entry it had but those in `left_out`: directories and
/// files bound in place, symbolic links made again. Each stays the real
/// one; only what is left out, or added after, is the view's.
fn cover(dir: &str, left_out: &[&str], flags: MountFlags) -> std::io::Result<()> {
    let context =
        |what: &str, e: std::io::Error| std::io::Error::new(e.kind(), format!("{what}: {e}"));
    // The entries there now, reachable through a descriptor once the tmpfs
    // covers their path.
    let old = fs::File::open(dir)?;
    let entries: Vec<String> = fs::read_dir(dir)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| !left_out.contains(&n.as_str()))
        .collect();
    mount::mount("rnic", dir, "tmpfs", flags, c"mode=0755")
        .map_err(|e| context("mount a tmpfs", e.into()))?;
    for e in &entries {
        let source = format!("/proc/self/fd/{}/{e}", old.as_raw_fd());
        let target = Path::new(dir).join(e);
        let kind = fs::symlink_metadata(&source)
            .map_err(|x| context(e, x))?
            .file_type();
        let put_back = || -> std::io::Result<()> {
            if kind.is_symlink() {
                std::os::unix::fs::symlink(fs::read_link(&source)?, &target)
            } else if kind.is_dir() {
                fs::create_dir(&target)?;
                Ok(mount::mount_bind_recursive(&source, &target)?)
            } else {
                fs::File::create(&target)?;
                Ok(mount::mount_bind(&source, &target)?)
            }
        };
        put_back().map_err(|x| context(&format!("bind {e}"), x))?;
    }
    Ok(())
}

/// `/dev/infiniband/uverbsN` for each of `n` devices, as `ibv_device.dev_name`
/// names them: programs such as UCX take a verbs device for usable only
/// if that node is a character device they may read and write, though rnic's
/// library never opens it. `/dev` is covered by a tmpfs of this namespace
/// with every entry of the real one bound (or, for symbolic links, made)
/// back in place ([`cover`]), so nothing is created in the host's `/dev`. Each node has
/// the numbers the kernel gives uverbs devices (231, 192 + N): with no RDMA
/// driver loaded, opening it fails (ENXIO), which is what it should do.
/// Where nodes cannot be made (a user namespace), `/dev/null` is bound in
/// its place: a character device that can be read and written.
fn device_nodes(n: usize) -> std::io::Result<()> {
    const DEV: &str = "/dev";
    cover(DEV, &["infiniband"], MountFlags::NOSUID)?;
    let ib = Path::new(DEV).join("infiniband");
    fs::create_dir(&ib)?;
    for i in 0..n {
        let node = ib.join(format!("uverbs{i}"));
        let made = rustix::fs::mknodat(
            rustix::fs::CWD,
            &node,
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o666),
            rustix::fs::makedev(231, 192 + i as u32),
        );
        if made.is_err() {
            fs::File::create(&node)?;
            mount::mount_bind("/dev/null", &node)?;
        }
        // The mode the umask may have narrowed.
        let _ = rustix::fs::chmod(&node, rustix::fs::Mode::from_raw_mode(0o666));
    }
    Ok(())
}

fn private_namespace() -> Result<(), String> {
    // SAFETY: `rnic exec` is single-threaded here, and NEWNS/NEWUSER leave
    // the file descriptor table alone.
    let first = unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNS) };
    if let Err(e) = first {
        if e != rustix::io::Errno::PERM {
            return Err(format!("--sysfs: unshare(CLONE_NEWNS): {e}"));
        }
        // Not root: a user namespace of our own grants the mount rights.
        let (uid, gid) = (rustix::process::getuid(), rustix::process::getgid());
        // SAFETY: as above.
        unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWUSER | UnshareFlags::NEWNS) }
            .map_err(|e| {
                format!("--sysfs needs root or unprivileged user namespaces: unshare: {e}")
            })?;
        let map = |file: &str, text: String| {
            fs::write(file, text).map_err(|e| format!("--sysfs: {file}: {e}"))
        };
        map("/proc/self/setgroups", "deny".into())?;
        map("/proc/self/uid_map", format!("0 {} 1", uid.as_raw()))?;
        map("/proc/self/gid_map", format!("0 {} 1", gid.as_raw()))?;
    }
    mount::mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .map_err(|e| format!("--sysfs: make / private: {e}"))
}

/// A GID as sysfs prints it: eight groups of four hex digits.
fn gid_text(addr: IpAddr) -> String {
    let v6 = match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    };
    let s = v6.segments();
    s.iter()
        .map(|g| format!("{g:04x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A GUID as sysfs prints it (network byte order, four groups).
fn guid_text(guid: u64) -> String {
    let b = guid.to_ne_bytes();
    b.chunks(2)
        .map(|p| format!("{:02x}{:02x}", p[0], p[1]))
        .collect::<Vec<_>>()
        .join(":")
}

fn write_device(d: &Dev<'_>) -> std::io::Result<()> {
    let dev = Path::new(CLASS).join("infiniband").join(d.name);
    let port = dev.join("ports/1");
    let put = |path: &Path, text: &str| -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::write(path, format!("{text}\n"))
    };
    let Some(&own) = d.gids.first() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}: no address", d.name),
        ));
    };
    let guid = guid_text(ibverbs::guid_of(own));
    put(&dev.join("node_type"), "1: CA")?;
    put(&dev.join("node_guid"), &guid)?;
    put(&dev.join("sys_image_guid"), &guid)?;
    put(&dev.join("node_desc"), d.name)?;
    put(&dev.join("fw_ver"), env!("CARGO_PKG_VERSION"))?;
    // What ibv_query_device says (hw_ver 0), and what libibumad reads.
    put(&dev.join("hw_rev"), "0x0")?;
    put(&dev.join("hca_type"), "rnic")?;
    put(&dev.join("board_id"), "rnic")?;
    put(&port.join("state"), "4: ACTIVE")?;
    put(&port.join("phys_state"), "5: LinkUp")?;
    put(&port.join("link_layer"), "Ethernet")?;
    put(&port.join("rate"), ibverbs::PORT_LINK.rate)?;
    // As ibv_query_port says.
    put(&port.join("lid"), &format!("0x{:x}", ibverbs::lid_of(own)))?;
    put(&port.join("sm_lid"), "0x0")?;
    put(&port.join("sm_sl"), "0")?;
    put(&port.join("lid_mask_count"), "0")?;
    put(
        &port.join("cap_mask"),
        &format!("0x{:08x}", ibverbs::PORT_CAP_FLAGS),
    )?;
    put(&port.join("pkeys/0"), "0xffff")?;
    fs::create_dir_all(port.join("gid_attrs/ndevs"))?;
    for (i, &addr) in d.gids.iter().enumerate() {
        put(&port.join(format!("gids/{i}")), &gid_text(addr))?;
        put(&port.join(format!("gid_attrs/types/{i}")), "RoCE v2")?;
        // No interface holding the address: a GID without a network
        // device, and no device/net entry (what rdma-core's tests take
        // as "no IP").
        if let Some((netdev, _)) = ibverbs::netdev_of(addr) {
            put(&port.join(format!("gid_attrs/ndevs/{i}")), &netdev)?;
            let link = dev.join("device/net").join(&netdev);
            if !link.exists() {
                fs::create_dir_all(dev.join("device/net"))?;
                std::os::unix::fs::symlink(Path::new(CLASS).join("net").join(&netdev), link)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_prints_gids_and_guids_as_the_kernel_does() {
        assert_eq!(
            gid_text("127.0.0.5".parse().unwrap()),
            "0000:0000:0000:0000:0000:ffff:7f00:0005"
        );
        assert_eq!(
            gid_text("fd00::1".parse().unwrap()),
            "fd00:0000:0000:0000:0000:0000:0000:0001"
        );
        assert_eq!(
            guid_text(ibverbs::guid_of("127.0.0.5".parse().unwrap())),
            "0200:7fff:fe00:0005"
        );
    }
}
