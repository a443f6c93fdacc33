//! Test support: an HPACK encoder that uses Huffman coding and dynamic-table indexing (so the
//! shim's decoding paths are exercised the way grpc-go exercises them), a raw HTTP/2 client that
//! can send any `:authority` (the `h2` client cannot), and a tonic health server on a Unix
//! socket with or without the shim.
#![allow(dead_code)]
// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use devicelet_transport::hpack::{self, Decoder, HeaderField, STATIC_TABLE, encode_integer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::server::UdsConnectInfo;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const TYPE_DATA: u8 = 0x0;
pub const TYPE_HEADERS: u8 = 0x1;
pub const TYPE_RST_STREAM: u8 = 0x3;
pub const TYPE_SETTINGS: u8 = 0x4;
pub const TYPE_PING: u8 = 0x6;
pub const TYPE_GOAWAY: u8 = 0x7;
pub const TYPE_CONTINUATION: u8 = 0x9;
pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

/// Grpc-go's kubelet.sock authority when it dials a bare path.
pub const KUBELET_SOCK_AUTHORITY: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";

/// How the encoder writes one field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repr {
    /// Index if the pair is in a table, else literal with incremental indexing.
    Indexed,
    /// Literal without indexing (§6.2.2).
    WithoutIndexing,
    /// Literal never indexed (§6.2.3).
    NeverIndexed,
}

/// HPACK encoder with Huffman strings and its own dynamic table (the client's).
pub struct TestEncoder {
    table: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    max_size: usize,
    pub huffman: bool,
}

impl Default for TestEncoder {
    fn default() -> Self {
        Self {
            table: VecDeque::new(),
            size: 0,
            max_size: hpack::DEFAULT_TABLE_SIZE,
            huffman: true,
        }
    }
}

impl TestEncoder {
    /// Emits a dynamic table size update (must start a block) and applies it.
    pub fn size_update(&mut self, new_max: usize, out: &mut Vec<u8>) {
        encode_integer(new_max, 5, 0x20, out);
        self.max_size = new_max;
        self.evict(new_max);
    }

    fn evict(&mut self, target: usize) {
        while self.size > target {
            let (n, v) = self.table.pop_back().unwrap();
            self.size -= n.len() + v.len() + 32;
        }
    }

    fn insert(&mut self, name: &[u8], value: &[u8]) {
        let sz = name.len() + value.len() + 32;
        if sz > self.max_size {
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict(self.max_size - sz);
        self.table.push_front((name.to_vec(), value.to_vec()));
        self.size += sz;
    }

    fn find_pair(&self, name: &[u8], value: &[u8]) -> Option<usize> {
        if let Some(i) = self.table.iter().position(|(n, v)| n == name && v == value) {
            return Some(STATIC_TABLE.len() + 1 + i);
        }
        STATIC_TABLE
            .iter()
            .position(|(n, v)| n.as_bytes() == name && v.as_bytes() == value)
            .map(|i| i + 1)
    }

    fn find_name(&self, name: &[u8]) -> Option<usize> {
        if let Some(i) = STATIC_TABLE.iter().position(|(n, _)| n.as_bytes() == name) {
            return Some(i + 1);
        }
        self.table
            .iter()
            .position(|(n, _)| n == name)
            .map(|i| STATIC_TABLE.len() + 1 + i)
    }

    pub fn string(&self, s: &[u8], out: &mut Vec<u8>) {
        if self.huffman && hpack::huffman::encoded_len(s) < s.len() {
            hpack::encode_huffman_string(s, out);
        } else {
            hpack::encode_raw_string(s, out);
        }
    }

    pub fn field(&mut self, name: &[u8], value: &[u8], repr: Repr, out: &mut Vec<u8>) {
        let (prefix, flags) = match repr {
            Repr::Indexed => {
                if let Some(index) = self.find_pair(name, value) {
                    encode_integer(index, 7, 0x80, out);
                    return;
                }
                (6, 0x40)
            }
            Repr::WithoutIndexing => (4, 0x00),
            Repr::NeverIndexed => (4, 0x10),
        };
        match self.find_name(name) {
            Some(index) => encode_integer(index, prefix, flags, out),
            None => {
                out.push(flags);
                self.string(name, out);
            }
        }
        self.string(value, out);
        if repr == Repr::Indexed {
            self.insert(name, value);
        }
    }

    pub fn encode(&mut self, fields: &[(&str, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (n, v) in fields {
            self.field(n.as_bytes(), v.as_bytes(), Repr::Indexed, &mut out);
        }
        out
    }

    pub fn dynamic_len(&self) -> usize {
        self.table.len()
    }
}

/// Request headers of a unary `grpc.health.v1.Health/Check` call as grpc-go sends them.
pub fn health_check_headers(authority: &str) -> Vec<(&str, &str)> {
    vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/grpc.health.v1.Health/Check"),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-go/1.72.0"),
        ("te", "trailers"),
    ]
}

pub fn frame(frame_type: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.push(frame_type);
    out.push(flags);
    out.extend_from_slice(&stream_id.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// What the server did with one call.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The call finished with trailers; `grpc-status` value and the gRPC response body.
    Grpc { status: String, body: Vec<u8> },
    /// RST_STREAM with this error code (1 = PROTOCOL_ERROR).
    Reset(u32),
    /// GOAWAY with this error code.
    GoAway(u32),
    /// The connection closed.
    Closed,
}

/// The gRPC body of a `HealthCheckResponse { status: SERVING }`.
pub const SERVING_BODY: &[u8] = &[0, 0, 0, 0, 2, 0x08, 0x01];

/// A hand-driven HTTP/2 client.
pub struct RawClient {
    pub stream: UnixStream,
    pub encoder: TestEncoder,
    decoder: Decoder,
}

impl RawClient {
    pub async fn connect(path: &Path) -> Self {
        let mut stream = UnixStream::connect(path).await.unwrap();
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(TYPE_SETTINGS, 0, 0, &[]));
        stream.write_all(&hello).await.unwrap();
        Self {
            stream,
            encoder: TestEncoder::default(),
            decoder: Decoder::new(hpack::DEFAULT_TABLE_SIZE),
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Sends the request body of a Health/Check for service "" (empty message), ending the stream.
    pub async fn send_empty_request_body(&mut self, stream_id: u32) {
        self.send(&frame(TYPE_DATA, END_STREAM, stream_id, &[0, 0, 0, 0, 0]))
            .await;
    }

    /// Sends a complete health check with the given `:authority` in one HEADERS frame.
    pub async fn health_check(&mut self, stream_id: u32, authority: &str) -> Outcome {
        let block = self.encoder.encode(&health_check_headers(authority));
        self.send(&frame(TYPE_HEADERS, END_HEADERS, stream_id, &block))
            .await;
        self.send_empty_request_body(stream_id).await;
        self.outcome(stream_id).await
    }

    async fn read_frame(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
        let mut head = [0u8; 9];
        self.stream.read_exact(&mut head).await.ok()?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        self.stream.read_exact(&mut payload).await.ok()?;
        let stream_id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        Some((head[3], head[4], stream_id, payload))
    }

    /// Reads frames until `stream_id` ends (trailers), is reset, or the connection goes away.
    pub async fn outcome(&mut self, stream_id: u32) -> Outcome {
        tokio::time::timeout(Duration::from_secs(10), self.outcome_inner(stream_id))
            .await
            .expect("server answered within 10 s")
    }

    async fn outcome_inner(&mut self, stream_id: u32) -> Outcome {
        let mut body = Vec::new();
        let mut block: Vec<u8> = Vec::new();
        let mut block_end_stream = false;
        loop {
            let Some((ty, flags, sid, payload)) = self.read_frame().await else {
                return Outcome::Closed;
            };
            match ty {
                TYPE_SETTINGS if flags & ACK == 0 => {
                    // The server may already have closed the connection; the read will say so.
                    let _ = self
                        .stream
                        .write_all(&frame(TYPE_SETTINGS, ACK, 0, &[]))
                        .await;
                }
                TYPE_PING if flags & ACK == 0 => {
                    let _ = self
                        .stream
                        .write_all(&frame(TYPE_PING, ACK, 0, &payload))
                        .await;
                }
                TYPE_GOAWAY => {
                    let code = u32::from_be_bytes(payload[4..8].try_into().unwrap());
                    return Outcome::GoAway(code);
                }
                TYPE_RST_STREAM if sid == stream_id => {
                    return Outcome::Reset(u32::from_be_bytes(payload[..4].try_into().unwrap()));
                }
                TYPE_DATA if sid == stream_id => body.extend_from_slice(&payload),
                TYPE_HEADERS | TYPE_CONTINUATION => {
                    let mut fragment = &payload[..];
                    if ty == TYPE_HEADERS {
                        block_end_stream = flags & END_STREAM != 0;
                        let mut pad = 0;
                        if flags & PADDED != 0 {
                            pad = fragment[0] as usize;
                            fragment = &fragment[1..];
                        }
                        if flags & PRIORITY != 0 {
                            fragment = &fragment[5..];
                        }
                        fragment = &fragment[..fragment.len() - pad];
                    }
                    block.extend_from_slice(fragment);
                    if flags & END_HEADERS != 0 {
                        // Always decode: the server's encoder state depends on every block.
                        let fields = self.decoder.decode(&block, 1 << 20).unwrap();
                        block.clear();
                        if sid == stream_id && block_end_stream {
                            let status = grpc_status(&fields).unwrap_or_default();
                            return Outcome::Grpc { status, body };
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

fn grpc_status(fields: &[HeaderField]) -> Option<String> {
    fields
        .iter()
        .find(|f| f.name.as_ref() == b"grpc-status")
        .map(|f| String::from_utf8_lossy(&f.value).into_owned())
}

/// What the server's interceptor saw of the last request.
#[derive(Default, Debug)]
pub struct Seen {
    pub peer_pid: Option<i32>,
    pub grpc_timeout: Option<String>,
    pub requests: usize,
}

/// A tonic server with the standard health service on a Unix socket.
pub struct TestServer {
    pub path: PathBuf,
    pub seen: Arc<Mutex<Seen>>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Starts the server at `dir/name`; with `shim` the connections go through `AuthorityShim`.
    pub async fn start(dir: &Path, name: &str, shim: bool) -> Self {
        Self::start_with(dir, name, shim, tonic::transport::Server::builder()).await
    }

    pub async fn start_with(
        dir: &Path,
        name: &str,
        shim: bool,
        mut builder: tonic::transport::Server,
    ) -> Self {
        let path = dir.join(name);
        let listener = devicelet_transport::bind_unix_listener(&path).unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let seen_in = seen.clone();
        let health = HealthService::from_health_reporter(HealthReporter::new());
        let service = HealthServer::with_interceptor(health, move |req: tonic::Request<()>| {
            let mut seen = seen_in.lock().unwrap();
            seen.requests += 1;
            seen.peer_pid = req
                .extensions()
                .get::<UdsConnectInfo>()
                .and_then(|info| info.peer_cred)
                .and_then(|cred| cred.pid());
            seen.grpc_timeout = req
                .metadata()
                .get("grpc-timeout")
                .map(|v| v.to_str().unwrap().to_string());
            Ok(req)
        });
        let (tx, rx) = oneshot::channel::<()>();
        let signal = async {
            let _ = rx.await;
        };
        let router = builder.add_service(service);
        let task = if shim {
            tokio::spawn(async move {
                router
                    .serve_with_incoming_shutdown(
                        devicelet_transport::shimmed_incoming(listener),
                        signal,
                    )
                    .await
                    .unwrap();
            })
        } else {
            tokio::spawn(async move {
                router
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::UnixListenerStream::new(listener),
                        signal,
                    )
                    .await
                    .unwrap();
            })
        };
        Self {
            path,
            seen,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .unwrap()
                .unwrap();
        }
    }
}
