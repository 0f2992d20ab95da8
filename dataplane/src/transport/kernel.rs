//! Kernel-socket transport: non-blocking listeners with `SO_REUSEPORT`, so each core has its own
//! accept queue and the kernel spreads connections over cores by 4-tuple hash.

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};

/// Binds a non-blocking listener on `addr`; `reuse_port` lets every core bind the same address.
pub fn bind_listener(
    addr: SocketAddr,
    reuse_port: bool,
    backlog: i32,
) -> io::Result<mio::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(backlog)?;
    Ok(mio::net::TcpListener::from_std(socket.into()))
}

/// Socket options for an accepted client connection: no Nagle delay on replies.
pub fn configure_stream(stream: &mio::net::TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)
}
