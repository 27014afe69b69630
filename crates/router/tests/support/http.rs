//! A blocking HTTP/1.1 GET for the router's `/metrics` and probe endpoints.

/// The whole response (status line, headers and body) to `GET path`.
pub(crate) fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    zinfer_metrics_http::get(addr, path).expect("GET from the metrics endpoint")
}
