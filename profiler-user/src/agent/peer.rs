//! Who is at the other end of a connection to the agent's HTTP endpoint, and where it
//! listens: a TCP address or a Unix socket (`--listen unix:PATH`) made without following
//! links, with a mode (and group) that limits who may connect.
//!
//! A local peer is known by the uid owning its socket: `SO_PEERCRED` on a Unix socket; on
//! TCP, the kernel's socket table (`NETLINK_SOCK_DIAG`, the table `ss -e` reads), asked for
//! the socket whose local end is the peer's address and port and whose remote end is ours.
//! Only a socket of this machine's network namespace is found there; any other peer is
//! remote.

use std::{
    io,
    net::{IpAddr, SocketAddr},
    os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    str::FromStr,
};

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use netlink_packet_sock_diag::{
    constants::{AF_INET, AF_INET6, IPPROTO_TCP},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
    SockDiagMessage,
};
use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket};

use crate::error::{Error, Result};

/// Where the endpoint listens: `--listen ADDR` or `--listen unix:PATH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A Unix socket's path (absolute).
    Unix(PathBuf),
}

impl FromStr for Listen {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Listen, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                return Err(format!("unix:{} is not an absolute path", path.display()));
            }
            return Ok(Listen::Unix(path));
        }
        s.parse()
            .map(Listen::Tcp)
            .map_err(|e| format!("{s}: {e} (an address such as 127.0.0.1:6060, or unix:/run/PATH)"))
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Tcp(addr) => write!(f, "http://{addr}"),
            Listen::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// The peer of one connection, as far as the endpoint knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A process of this machine, by the uid that owns its socket.
    Local(u32),
    /// Anything else: a remote address (or a local socket the kernel's table did not name).
    Remote(IpAddr),
}

/// A `NETLINK_SOCK_DIAG` socket, asked for the owner of one TCP socket at a time (an exact
/// lookup: the kernel finds it by its addresses in its hash table, whatever the number of
/// sockets on the machine).
pub struct SockDiag {
    socket: Socket,
    sequence: u32,
    buffer: Vec<u8>,
}

impl SockDiag {
    /// Opens the netlink socket.
    pub fn open() -> io::Result<SockDiag> {
        let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
        socket.bind_auto()?;
        socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;
        // The kernel answers a request while sending it: the answer is queued when `send`
        // returns, and a missing one must not block the accept loop.
        socket.set_non_blocking(true)?;
        Ok(SockDiag {
            socket,
            sequence: 0,
            buffer: vec![0; 8192],
        })
    }

    /// The uid owning the TCP socket of this machine whose local end is `peer` and whose
    /// remote end is `local` (the other end of a connection accepted on `local` from
    /// `peer`); `None` when there is none (a remote peer) or the kernel did not say.
    pub fn tcp_owner(&mut self, peer: SocketAddr, local: SocketAddr) -> Option<u32> {
        let (peer_ip, local_ip) = (canonical(peer.ip()), canonical(local.ip()));
        let family = match (peer_ip, local_ip) {
            (IpAddr::V4(_), IpAddr::V4(_)) => AF_INET,
            (IpAddr::V6(_), IpAddr::V6(_)) => AF_INET6,
            _ => return None,
        };
        self.sequence = self.sequence.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST;
        header.sequence_number = self.sequence;
        let mut request = NetlinkMessage::new(
            header,
            SockDiagMessage::InetRequest(InetRequest {
                family,
                protocol: IPPROTO_TCP,
                extensions: ExtensionFlags::empty(),
                states: StateFlags::all(),
                socket_id: SocketId {
                    source_port: peer.port(),
                    destination_port: local.port(),
                    source_address: peer_ip,
                    destination_address: local_ip,
                    interface_id: 0,
                    // INET_DIAG_NOCOOKIE: any socket with these addresses.
                    cookie: [0xff; 8],
                },
            })
            .into(),
        );
        request.finalize();
        let mut bytes = vec![0; request.buffer_len()];
        request.serialize(&mut bytes);
        self.socket.send(&bytes, 0).ok()?;
        // Answers to earlier requests that were not read (none are expected) are skipped by
        // their sequence number.
        for _ in 0..8 {
            let size = self.socket.recv(&mut &mut self.buffer[..], 0).ok()?;
            let mut offset = 0;
            while offset < size {
                let message =
                    NetlinkMessage::<SockDiagMessage>::deserialize(&self.buffer[offset..size])
                        .ok()?;
                let length = message.header.length as usize;
                if message.header.sequence_number == self.sequence {
                    return match message.payload {
                        NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                            Some(r.header.uid)
                        }
                        _ => None,
                    };
                }
                if length == 0 {
                    break;
                }
                offset += length;
            }
        }
        None
    }
}

/// An IPv4 address mapped into IPv6 (a dual-stack listener's view of an IPv4 peer) as the
/// IPv4 address the peer's own socket has.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Binds a Unix socket at `path` with `mode` (and group `gid`), safely: every directory
/// above it must be root's (or this process's) and writable by no one else unless sticky
/// (as sshd's StrictModes), so no other user can swap a component; what is already at
/// `path` is removed only when it is a stale socket of this process's user (nothing answers
/// on it), and a link, a file or another user's socket there is refused. `bind` itself
/// never follows a link at the last component.
pub fn bind_unix(path: &Path, mode: u32, gid: Option<u32>) -> Result<tokio::net::UnixListener> {
    let refuse = |reason: String| Error::InvalidTarget {
        spec: format!("unix:{}", path.display()),
        reason: format!("--listen: {reason}"),
    };
    let euid = rustix::process::geteuid().as_raw();
    for dir in path.ancestors().skip(1) {
        let meta = std::fs::metadata(dir).map_err(|e| refuse(format!("{}: {e}", dir.display())))?;
        let perms = meta.permissions().mode();
        if !meta.is_dir() {
            return Err(refuse(format!("{} is not a folder", dir.display())));
        }
        if meta.uid() != 0 && meta.uid() != euid {
            return Err(refuse(format!(
                "{} belongs to uid {}, who could replace the socket",
                dir.display(),
                meta.uid()
            )));
        }
        if perms & 0o022 != 0 && perms & 0o1000 == 0 {
            return Err(refuse(format!(
                "{} is writable by others (mode {:o}) and not sticky: they could replace the \
                 socket",
                dir.display(),
                perms & 0o7777
            )));
        }
    }
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(refuse(e.to_string())),
        Ok(meta) if meta.file_type().is_socket() && meta.uid() == euid => {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => {
                    return Err(refuse(
                        "another process serves on this socket (another agent?)".into(),
                    ))
                }
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    std::fs::remove_file(path)
                        .map_err(|e| refuse(format!("removing the stale socket: {e}")))?;
                }
                Err(e) => return Err(refuse(format!("cannot tell whether it is stale: {e}"))),
            }
        }
        Ok(meta) => {
            return Err(refuse(format!(
                "something other than a socket of uid {euid} is there ({}, uid {}): not \
                 removed",
                if meta.file_type().is_symlink() {
                    "a symbolic link"
                } else if meta.file_type().is_socket() {
                    "a socket"
                } else {
                    "a file"
                },
                meta.uid()
            )))
        }
    }
    let listener =
        tokio::net::UnixListener::bind(path).map_err(|e| refuse(format!("cannot bind: {e}")))?;
    // The parent is trusted (above): the path is the socket just made. Its mode at `bind`
    // is 0777 less the umask (0755 under systemd: only root may connect, connecting needs
    // write permission) until it is set here.
    if let Some(gid) = gid {
        std::os::unix::fs::lchown(path, None, Some(gid))
            .map_err(|e| refuse(format!("setting its group: {e}")))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| refuse(format!("setting its mode: {e}")))?;
    Ok(listener)
}

/// Reads the endpoint's bearer token from `path`: one line, kept secret (the file must not
/// be readable by group or others, as ssh keys).
pub fn read_token(path: &Path) -> Result<Vec<u8>> {
    let refuse = |reason: String| Error::InvalidTarget {
        spec: path.display().to_string(),
        reason: format!("--listen-token-file: {reason}"),
    };
    let meta = std::fs::metadata(path).map_err(|e| refuse(e.to_string()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(refuse(format!(
            "readable or writable by group or others (mode {:o}): chmod 600 it",
            meta.permissions().mode() & 0o777
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| refuse(e.to_string()))?;
    let token = text.trim();
    if token.len() < 16 {
        return Err(refuse("the token is shorter than 16 characters".into()));
    }
    Ok(token.as_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_and_unix_paths() {
        assert_eq!(
            "127.0.0.1:6060".parse::<Listen>(),
            Ok(Listen::Tcp("127.0.0.1:6060".parse().unwrap()))
        );
        assert_eq!(
            "unix:/run/bpfprof/agent.sock".parse::<Listen>(),
            Ok(Listen::Unix("/run/bpfprof/agent.sock".into()))
        );
        assert!("unix:agent.sock".parse::<Listen>().is_err());
        assert!("localhost".parse::<Listen>().is_err());
    }

    #[test]
    fn the_kernel_names_the_owner_of_a_loopback_connection() {
        let Ok(mut diag) = SockDiag::open() else {
            eprintln!("skipping: no NETLINK_SOCK_DIAG here");
            return;
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server, peer) = listener.accept().unwrap();
        let local = listener.local_addr().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        let uid = rustix::process::geteuid().as_raw();
        assert_eq!(diag.tcp_owner(peer, local), Some(uid));
        // Twice on one socket: the sequence numbers keep the answers apart.
        assert_eq!(diag.tcp_owner(peer, local), Some(uid));
        // No socket has these addresses.
        let nowhere: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(diag.tcp_owner(nowhere, local), None);
        drop(client);
    }
}
