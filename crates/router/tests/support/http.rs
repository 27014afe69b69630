//! A blocking HTTP/1.1 GET for the router's `/metrics` and probe endpoints.

use std::io::{Read, Write};

/// The whole response (status line, headers and body) to `GET path`.
pub(crate) fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the metrics endpoint");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    response
}
