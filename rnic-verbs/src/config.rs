//! Everything rnic reads from the environment, in one place.
//!
//! [`VARIABLES`] lists every `RNIC_*` variable a user may set, with its
//! default and meaning: `rnic config` prints it, and the README's table is
//! made from it. [`Config`] is what a device reads of them, once, when it
//! starts ([`Config::from_env`]); a Rust program may build one itself and
//! open a device with it ([`crate::Device::open_with`]), leaving the
//! environment out.

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::PathBuf;

use crate::{Error, Impairment, Result};

/// Who reads a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadBy {
    /// Every device, when it starts ([`Config`]).
    Device,
    /// The drop-in `libibverbs.so.1`.
    DropIn,
    /// `rnic exec`.
    Exec,
}

impl ReadBy {
    /// As the table says it.
    pub const fn name(self) -> &'static str {
        match self {
            ReadBy::Device => "every device",
            ReadBy::DropIn => "the drop-in libibverbs",
            ReadBy::Exec => "rnic exec",
        }
    }
}

/// One environment variable rnic reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variable {
    /// Its name.
    pub name: &'static str,
    /// What it is when unset.
    pub default: &'static str,
    /// What it does, in a line.
    pub meaning: &'static str,
    /// Who reads it.
    pub read_by: ReadBy,
}

/// Every `RNIC_*` variable a user may set (the test suite's own variables
/// are in `docs/testing.md`).
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "RNIC_ADDR",
        default: "the first loopback address whose UDP port 4791 is free",
        meaning: "The IP address of a device opened without one (`Device::open_loopback`, the drop-in's default device).",
        read_by: ReadBy::Device,
    },
    Variable {
        name: "RNIC_IFACE",
        default: "loopback",
        meaning: "Open the drop-in's default device on this network interface, taking whole frames in (needs CAP_NET_RAW): the transport for rdma_rxe and hardware peers.",
        read_by: ReadBy::Device,
    },
    Variable {
        name: "RNIC_PCAP",
        default: "no capture",
        meaning: "Record every packet of every device of the process in this pcap file (sent ones as the NIC sends them, before RNIC_IMPAIR).",
        read_by: ReadBy::Device,
    },
    Variable {
        name: "RNIC_IMPAIR",
        default: "no impairment",
        meaning: "Impair each device's egress: `loss=P,dup=P,reorder=P,corrupt=P,delay=D,seed=N` (P as 5% or 0.05, D as 1ms or 200us).",
        read_by: ReadBy::Device,
    },
    Variable {
        name: "RNIC_GSO",
        default: "on for loopback with the UDP transport, else off",
        meaning: "`on` or `off`: send runs of datagrams as UDP GSO sends, each segment's ICRC made for the IPv4 identification the kernel gives it.",
        read_by: ReadBy::Device,
    },
    Variable {
        name: "RNIC_RING",
        default: "on where the process has CAP_NET_RAW",
        meaning: "`on` or `off`: on loopback with the UDP transport, take packets in through a receive ring the kernel fills (a packet socket on `lo`, which needs CAP_NET_RAW; without it, the UDP socket): a receive is no system call.",
        read_by: ReadBy::Device,
    },
    Variable {
        name: "RNIC_RAW_SENDS",
        default: "on where the process has CAP_NET_RAW",
        meaning: "`on` or `off`: send IPv4 datagrams past the kernel's IP and UDP layers, through a raw packet socket, where that reaches the peer: on loopback to NICs that take packets in through a receive ring (`RNIC_RING`), on an interface (`RNIC_IFACE`) to neighbours the kernel has resolved; everything else through UDP sockets.",
        read_by: ReadBy::Device,
    },
    Variable {
        name: "RNIC_RESPONSE_SOCKET",
        default: "off",
        meaning: "`on` or `off`: take RC responses in on a second socket while the engine thread watches for a program that spins on memory (on the UDP socket, not through a receive ring).",
        read_by: ReadBy::Device,
    },
    Variable {
        name: "RNIC_ENGINE_PRIORITY",
        default: "realtime",
        meaning: "`realtime` (SCHED_FIFO 1 where the process may) or `normal`: the engine thread's scheduling class.",
        read_by: ReadBy::Device,
    },
    Variable {
        name: "RNIC_BUSY_POLL_US",
        default: "50",
        meaning: "Microseconds the engine thread lingers on the socket after its last piece of work, and a thread waiting for a completion event spins before it sleeps, where that pays (0: never).",
        read_by: ReadBy::Device,
    },
    Variable {
        name: "RNIC_DEVICES",
        default: "one device, rnic0",
        meaning: "The drop-in's devices, `NAME=ADDR` entries separated by commas (`rnic exec --devices` sets it).",
        read_by: ReadBy::DropIn,
    },
    Variable {
        name: "RNIC_LOG",
        default: "no log",
        meaning: "A tracing filter for the log on stderr (`rnic_verbs=debug`: what the engine decides; `=trace`: every packet); the `rnic` tool reads it too.",
        read_by: ReadBy::DropIn,
    },
    Variable {
        name: "RNIC_LIBIBVERBS_DIR",
        default: "`rnic-ibverbs/` beside the `rnic` executable",
        meaning: "Where `rnic exec` finds the drop-in `libibverbs.so.1`.",
        read_by: ReadBy::Exec,
    },
];

/// [`VARIABLES`] as a Markdown table (what the README shows).
pub fn markdown_table() -> String {
    let mut t =
        String::from("| variable | default | what it does | read by |\n|---|---|---|---|\n");
    for v in VARIABLES {
        t.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            v.name,
            v.default,
            v.meaning,
            v.read_by.name()
        ));
    }
    t
}

/// The engine thread's scheduling class (`RNIC_ENGINE_PRIORITY`; see the
/// engine's `sched` module for why real time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Priority {
    /// SCHED_FIFO 1 if permitted, else normal.
    #[default]
    Realtime,
    /// The normal class, as the process's other threads.
    Normal,
}

impl Priority {
    /// The variable's value, if set.
    fn parse(value: Option<&str>) -> Result<Priority> {
        match value {
            None | Some("realtime" | "") => Ok(Priority::Realtime),
            Some("normal") => Ok(Priority::Normal),
            Some(v) => Err(bad("RNIC_ENGINE_PRIORITY", v, "realtime or normal")),
        }
    }
}

/// How long the engine thread lingers on the socket after its last piece
/// of work, where lingering pays, unless `RNIC_BUSY_POLL_US` says (ns): a
/// few round trips of a responder's program.
pub const LINGER_WINDOW: u64 = 50_000;

/// What a device reads of the environment when it starts (each field
/// names its variable; see [`VARIABLES`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `RNIC_ADDR`: the address of a device opened without one.
    pub addr: Option<IpAddr>,
    /// `RNIC_IFACE`: the interface of the drop-in's default device.
    pub iface: Option<String>,
    /// `RNIC_PCAP`: where every packet is recorded.
    pub pcap: Option<PathBuf>,
    /// `RNIC_IMPAIR`: the impairment of each device's egress.
    pub impair: Option<Impairment>,
    /// `RNIC_GSO`: whether runs of datagrams go out as UDP GSO sends
    /// (`None`: on loopback with the UDP transport only).
    pub gso: Option<bool>,
    /// `RNIC_RING`: on loopback with the UDP transport, packets come in
    /// through a receive ring on `lo` where the process may open one (on
    /// by default).
    pub ring: bool,
    /// `RNIC_RAW_SENDS`: IPv4 datagrams go past IP and UDP where that
    /// reaches the peer (on by default; see `frames::FrameSender`).
    pub raw_sends: bool,
    /// `RNIC_RESPONSE_SOCKET`: RC responses steered to a socket of their
    /// own while the engine thread stays for a program.
    pub response_socket: bool,
    /// `RNIC_ENGINE_PRIORITY`: the engine thread's scheduling class.
    pub priority: Priority,
    /// `RNIC_BUSY_POLL_US`: how long the engine thread lingers, and a
    /// driven wait spins (ns).
    pub linger_window: u64,
}

impl Default for Config {
    /// What a device does with no variable set.
    fn default() -> Config {
        Config {
            addr: None,
            iface: None,
            pcap: None,
            impair: None,
            gso: None,
            ring: true,
            raw_sends: true,
            response_socket: false,
            priority: Priority::Realtime,
            linger_window: LINGER_WINDOW,
        }
    }
}

impl Config {
    /// Read the variables of [`VARIABLES`] that a device reads from the
    /// process's environment; an error names a variable whose value it
    /// cannot use.
    pub fn from_env() -> Result<Config> {
        Config::from_vars(|name| std::env::var_os(name))
    }

    /// [`Config::from_env`] with `get` for the environment.
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Result<Config> {
        let text = |name: &str| -> Result<Option<String>> {
            match get(name) {
                None => Ok(None),
                Some(v) => v
                    .into_string()
                    .map(Some)
                    .map_err(|v| bad(name, &v.to_string_lossy(), "UTF-8 text")),
            }
        };
        let on_off = |name: &str| -> Result<Option<bool>> {
            match text(name)?.as_deref() {
                None => Ok(None),
                Some("on" | "1") => Ok(Some(true)),
                Some("off" | "0") => Ok(Some(false)),
                Some(v) => Err(bad(name, v, "on or off")),
            }
        };
        let addr = match text("RNIC_ADDR")? {
            Some(a) => Some(crate::parse_env_addr("RNIC_ADDR", &a)?),
            None => None,
        };
        let impair = match text("RNIC_IMPAIR")? {
            Some(v) => Some(v.parse::<Impairment>().map_err(|_| {
                bad(
                    "RNIC_IMPAIR",
                    &v,
                    "loss=P,dup=P,reorder=P,corrupt=P,delay=D,seed=N (P as 5% or 0.05, D as 1ms or 200us)",
                )
            })?),
            None => None,
        };
        let linger_window = match text("RNIC_BUSY_POLL_US")? {
            Some(v) => v
                .trim()
                .parse::<u64>()
                .map_err(|_| bad("RNIC_BUSY_POLL_US", &v, "microseconds, 0 or more"))?
                .saturating_mul(1000),
            None => LINGER_WINDOW,
        };
        Ok(Config {
            addr,
            iface: text("RNIC_IFACE")?.filter(|i| !i.is_empty()),
            pcap: get("RNIC_PCAP").map(PathBuf::from),
            impair,
            gso: on_off("RNIC_GSO")?,
            ring: on_off("RNIC_RING")?.unwrap_or(true),
            raw_sends: on_off("RNIC_RAW_SENDS")?.unwrap_or(true),
            response_socket: on_off("RNIC_RESPONSE_SOCKET")?.unwrap_or(false),
            priority: Priority::parse(text("RNIC_ENGINE_PRIORITY")?.as_deref())?,
            linger_window,
        })
    }
}

/// The error of variable `var`, whose `value` is not `expected`.
fn bad(var: &str, value: &str, expected: &'static str) -> Error {
    Error::BadEnv {
        var: var.to_string(),
        value: value.to_string(),
        expected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    fn config(vars: &[(&str, &str)]) -> Result<Config> {
        Config::from_vars(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
        })
    }

    #[test]
    fn the_variable_is_parsed_and_a_bad_value_named() {
        assert_eq!(Priority::parse(None).unwrap(), Priority::Realtime);
        assert_eq!(Priority::parse(Some("")).unwrap(), Priority::Realtime);
        assert_eq!(
            Priority::parse(Some("realtime")).unwrap(),
            Priority::Realtime
        );
        assert_eq!(Priority::parse(Some("normal")).unwrap(), Priority::Normal);
        let e = Priority::parse(Some("fast")).unwrap_err().to_string();
        assert_eq!(
            e,
            "RNIC_ENGINE_PRIORITY=\"fast\": expected realtime or normal"
        );
    }

    /// A device reads exactly the variables the list says it reads: a
    /// variable added to one and not the other fails here.
    #[test]
    fn a_device_reads_the_variables_the_list_names() {
        let asked = RefCell::new(BTreeSet::new());
        Config::from_vars(|name| {
            asked.borrow_mut().insert(name.to_string());
            None
        })
        .unwrap();
        let listed: BTreeSet<String> = VARIABLES
            .iter()
            .filter(|v| v.read_by == ReadBy::Device)
            .map(|v| v.name.to_string())
            .collect();
        assert_eq!(asked.into_inner(), listed);
        let mut names: Vec<_> = VARIABLES.iter().map(|v| v.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), VARIABLES.len(), "a variable listed twice");
    }

    #[test]
    fn unset_is_the_default_and_each_value_is_read() {
        assert_eq!(config(&[]).unwrap(), Config::default());
        let c = config(&[
            ("RNIC_ADDR", " 127.0.0.9 "),
            ("RNIC_IFACE", "veth0"),
            ("RNIC_PCAP", "/tmp/x.pcap"),
            ("RNIC_IMPAIR", "loss=5%"),
            ("RNIC_GSO", "off"),
            ("RNIC_RING", "off"),
            ("RNIC_RAW_SENDS", "off"),
            ("RNIC_RESPONSE_SOCKET", "on"),
            ("RNIC_ENGINE_PRIORITY", "normal"),
            ("RNIC_BUSY_POLL_US", "0"),
        ])
        .unwrap();
        assert_eq!(c.addr, Some(IpAddr::from([127, 0, 0, 9])));
        assert_eq!(c.iface.as_deref(), Some("veth0"));
        assert_eq!(c.pcap, Some(PathBuf::from("/tmp/x.pcap")));
        assert!(c.impair.is_some());
        assert_eq!(c.gso, Some(false));
        assert!(!c.ring);
        assert!(!c.raw_sends);
        assert!(c.response_socket);
        assert_eq!(c.priority, Priority::Normal);
        assert_eq!(c.linger_window, 0);
        assert_eq!(config(&[("RNIC_IFACE", "")]).unwrap().iface, None);
        assert_eq!(
            config(&[("RNIC_BUSY_POLL_US", "7")]).unwrap().linger_window,
            7_000
        );
    }

    #[test]
    fn a_bad_value_is_an_error_that_names_its_variable() {
        for (var, value) in [
            ("RNIC_ADDR", "localhost"),
            ("RNIC_IMPAIR", "loss=7"),
            ("RNIC_GSO", "yes"),
            ("RNIC_RESPONSE_SOCKET", "maybe"),
            ("RNIC_ENGINE_PRIORITY", "fast"),
            ("RNIC_BUSY_POLL_US", "-1"),
        ] {
            let e = config(&[(var, value)]).unwrap_err().to_string();
            assert!(e.starts_with(var) && e.contains(value), "{e}");
        }
    }

    #[test]
    fn the_table_has_a_row_per_variable() {
        let t = markdown_table();
        assert_eq!(t.lines().count(), 2 + VARIABLES.len());
        for v in VARIABLES {
            assert!(t.contains(&format!("| `{}` |", v.name)), "{}", v.name);
        }
    }
}
