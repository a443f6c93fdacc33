//! `AuthorityShim`: accept any HTTP/2 `:authority` on Unix-socket gRPC servers.
//!
//! Why this exists (spec/devicemanager.md §1.11, spec/ecosystem.md A11 row 63): Go gRPC
//! clients that dial a Unix socket with a custom dialer send odd `:authority` values, depending
//! on their grpc-go version: the socket path (`/var/lib/kubelet/device-plugins/kubelet.sock`),
//! the path without its leading slash, `localhost`, or an empty string. NVIDIA's device plugin
//! registers with `kubelet.sock` exactly like that. h2 (under hyper and tonic 0.14) parses
//! `:authority` as `http::uri::Authority` and answers anything else with RST_STREAM
//! PROTOCOL_ERROR (hyperium/h2#487 proposed relaxing this and was never merged; hyperium/hyper#3750:
//! "a path is not a valid authority"). We must accept those clients without patching h2.
//!
//! How: the shim wraps the accepted server-side stream and rewrites the client→server byte
//! stream before h2 reads it. It follows the HTTP/2 framing (RFC 9113 §3.4 preface, §4.1 frame
//! layout) and passes every frame through unchanged except header blocks (HEADERS plus the
//! CONTINUATION frames up to END_HEADERS). Those it HPACK-decodes with a decoder that mirrors
//! the client's dynamic table, replaces an `:authority` that does not parse as an
//! `http::uri::Authority` (or is empty) with `localhost`, and re-encodes every field as a literal
//! without indexing. The re-encoded block never touches h2's dynamic table, so h2's decoder state
//! stays trivially consistent no matter how the client used its own table. Padding is dropped,
//! PRIORITY fields are kept, and the output is split into frames of at most 16384 octets (the
//! minimum SETTINGS_MAX_FRAME_SIZE every peer must accept). Writes (server→client) are not
//! touched.
//!
//! Limits: a header block larger than [`MAX_HEADER_BLOCK`] (compressed or decoded) fails the
//! connection with an `io::Error`, and so does any malformed frame or HPACK block; nothing
//! here panics on input.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

use crate::hpack::{self, HeaderField};

/// Client connection preface (RFC 9113 §3.4).
pub const CONNECTION_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Largest header block accepted, both as received (all fragments together) and decoded.
/// h2's own limit (hyper's default max header list size) is 16 KiB, so anything legitimate fits.
pub const MAX_HEADER_BLOCK: usize = 1 << 20;

/// Largest dynamic table the client may select with a size update. The server (h2) advertises
/// the default 4096 unless configured otherwise; we accept up to 64 KiB so a server configured
/// with a larger SETTINGS_HEADER_TABLE_SIZE still works, while memory stays bounded.
pub const MAX_CLIENT_TABLE_SIZE: usize = 64 * 1024;

/// Largest frame payload the shim emits (RFC 9113 §4.2 minimum SETTINGS_MAX_FRAME_SIZE).
pub const MAX_EMITTED_FRAME: usize = 16_384;

/// `:authority` that replaces an invalid one (what the kubelet itself sends, k/k PR #112597).
pub const REPLACEMENT_AUTHORITY: &str = "localhost";

const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
const PRIORITY_LEN: usize = 5;

/// Why the shim failed a connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShimError {
    #[error("HTTP/2 header block on stream {stream_id}: {source}")]
    Hpack {
        stream_id: u32,
        #[source]
        source: hpack::HpackError,
    },
    #[error("HTTP/2 header block on stream {stream_id} exceeds {limit} bytes")]
    HeaderBlockTooLarge { stream_id: u32, limit: usize },
    #[error(
        "HTTP/2 HEADERS frame on stream {stream_id} is too short for its padding/priority fields"
    )]
    HeadersFrameTooShort { stream_id: u32 },
    #[error(
        "HTTP/2 header block on stream {stream_id} not finished: expected CONTINUATION, got frame type {frame_type:#x} on stream {got_stream_id}"
    )]
    ExpectedContinuation {
        stream_id: u32,
        frame_type: u8,
        got_stream_id: u32,
    },
}

impl From<ShimError> for io::Error {
    fn from(e: ShimError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

#[derive(Debug, Clone, Copy)]
struct FrameHead {
    length: usize,
    frame_type: u8,
    flags: u8,
    stream_id: u32,
}

impl FrameHead {
    fn parse(raw: &[u8; FRAME_HEADER_LEN]) -> Self {
        Self {
            length: (usize::from(raw[0]) << 16) | (usize::from(raw[1]) << 8) | usize::from(raw[2]),
            frame_type: raw[3],
            flags: raw[4],
            // The reserved bit is ignored on receipt (RFC 9113 §4.1).
            stream_id: u32::from_be_bytes([raw[5], raw[6], raw[7], raw[8]]) & 0x7fff_ffff,
        }
    }
}

fn put_frame_head(out: &mut BytesMut, length: usize, frame_type: u8, flags: u8, stream_id: u32) {
    // `length` never exceeds MAX_EMITTED_FRAME here, so it fits in 24 bits.
    out.put_slice(&(length as u32).to_be_bytes()[1..]);
    out.put_u8(frame_type);
    out.put_u8(flags);
    out.put_u32(stream_id);
}

#[derive(Debug)]
enum State {
    /// Matching the 24-octet preface; `matched` octets seen so far.
    Preface { matched: usize },
    /// Not HTTP/2 (preface mismatch): pass everything through and let h2 reject it.
    Transparent,
    /// Reading a 9-octet frame header.
    FrameHeader { have: usize },
    /// Passing `remaining` payload octets of a frame we do not rewrite.
    PassPayload { remaining: usize },
    /// Collecting the payload of a HEADERS or CONTINUATION frame.
    CollectPayload { head: FrameHead },
    /// A previous error ended the connection.
    Failed(ShimError),
}

/// A header block under assembly (HEADERS seen, END_HEADERS not yet).
#[derive(Debug)]
struct PendingBlock {
    stream_id: u32,
    end_stream: bool,
    priority: Option<[u8; PRIORITY_LEN]>,
    fragment: Vec<u8>,
}

/// The synchronous client→server rewriter behind [`AuthorityShim`]: feed it bytes in any
/// chunking, it appends the rewritten stream to an output buffer.
#[derive(Debug)]
pub struct InboundRewriter {
    state: State,
    head_buf: [u8; FRAME_HEADER_LEN],
    frame_payload: Vec<u8>,
    pending: Option<PendingBlock>,
    decoder: hpack::Decoder,
    encoded: Vec<u8>,
    authorities_replaced: u64,
}

impl Default for InboundRewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl InboundRewriter {
    pub fn new() -> Self {
        Self {
            state: State::Preface { matched: 0 },
            head_buf: [0; FRAME_HEADER_LEN],
            frame_payload: Vec::new(),
            pending: None,
            decoder: hpack::Decoder::new(MAX_CLIENT_TABLE_SIZE),
            encoded: Vec::new(),
            authorities_replaced: 0,
        }
    }

    /// How many `:authority` values were replaced so far.
    pub fn authorities_replaced(&self) -> u64 {
        self.authorities_replaced
    }

    /// How many upcoming input octets are guaranteed to pass through unchanged (0 when the
    /// next octets must be parsed).
    pub fn passthrough_budget(&self) -> usize {
        match self.state {
            State::Transparent => usize::MAX,
            State::PassPayload { remaining } => remaining,
            _ => 0,
        }
    }

    /// Tells the rewriter that `n <= passthrough_budget()` octets were passed on by the caller
    /// without going through [`feed`](Self::feed).
    pub fn consume_passthrough(&mut self, n: usize) {
        if let State::PassPayload { remaining } = &mut self.state {
            *remaining = remaining.saturating_sub(n);
            if *remaining == 0 {
                self.state = State::FrameHeader { have: 0 };
            }
        }
    }

    /// Consumes all of `input`, appending rewritten output to `out`. After an error every later
    /// call returns the same error.
    pub fn feed(&mut self, mut input: &[u8], out: &mut BytesMut) -> Result<(), ShimError> {
        while !input.is_empty() {
            match &mut self.state {
                State::Failed(e) => return Err(e.clone()),
                State::Transparent => {
                    out.put_slice(input);
                    return Ok(());
                }
                State::Preface { matched } => {
                    let want = &CONNECTION_PREFACE[*matched..];
                    let n = want.len().min(input.len());
                    if input[..n] == want[..n] {
                        *matched += n;
                        input = &input[n..];
                        if *matched == CONNECTION_PREFACE.len() {
                            out.put_slice(CONNECTION_PREFACE);
                            self.state = State::FrameHeader { have: 0 };
                        }
                    } else {
                        // Not HTTP/2 prior knowledge: hand everything to h2 unchanged.
                        out.put_slice(&CONNECTION_PREFACE[..*matched]);
                        self.state = State::Transparent;
                    }
                }
                State::FrameHeader { have } => {
                    let n = (FRAME_HEADER_LEN - *have).min(input.len());
                    self.head_buf[*have..*have + n].copy_from_slice(&input[..n]);
                    *have += n;
                    input = &input[n..];
                    if *have == FRAME_HEADER_LEN {
                        let head = FrameHead::parse(&self.head_buf);
                        self.on_frame_head(head, out)?;
                    }
                }
                State::PassPayload { remaining } => {
                    let n = (*remaining).min(input.len());
                    out.put_slice(&input[..n]);
                    input = &input[n..];
                    *remaining -= n;
                    if *remaining == 0 {
                        self.state = State::FrameHeader { have: 0 };
                    }
                }
                State::CollectPayload { head } => {
                    let head = *head;
                    let n = (head.length - self.frame_payload.len()).min(input.len());
                    self.frame_payload.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    if self.frame_payload.len() == head.length {
                        self.on_collected(head, out)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn fail(&mut self, e: ShimError) -> ShimError {
        self.state = State::Failed(e.clone());
        self.pending = None;
        self.frame_payload = Vec::new();
        e
    }

    fn on_frame_head(&mut self, head: FrameHead, out: &mut BytesMut) -> Result<(), ShimError> {
        if let Some(pending) = &self.pending {
            // RFC 9113 §6.10: only CONTINUATION frames of the same stream may follow.
            if head.frame_type != TYPE_CONTINUATION || head.stream_id != pending.stream_id {
                let e = ShimError::ExpectedContinuation {
                    stream_id: pending.stream_id,
                    frame_type: head.frame_type,
                    got_stream_id: head.stream_id,
                };
                return Err(self.fail(e));
            }
            if pending.fragment.len() + head.length > MAX_HEADER_BLOCK {
                let e = ShimError::HeaderBlockTooLarge {
                    stream_id: head.stream_id,
                    limit: MAX_HEADER_BLOCK,
                };
                return Err(self.fail(e));
            }
        } else if head.frame_type == TYPE_HEADERS {
            if head.length > MAX_HEADER_BLOCK {
                let e = ShimError::HeaderBlockTooLarge {
                    stream_id: head.stream_id,
                    limit: MAX_HEADER_BLOCK,
                };
                return Err(self.fail(e));
            }
        } else {
            // Any other frame (a stray CONTINUATION included, which h2 rejects itself) passes.
            out.put_slice(&self.head_buf);
            self.state = if head.length == 0 {
                State::FrameHeader { have: 0 }
            } else {
                State::PassPayload {
                    remaining: head.length,
                }
            };
            return Ok(());
        }
        self.frame_payload.clear();
        self.state = State::CollectPayload { head };
        if head.length == 0 {
            self.on_collected(head, out)?;
        }
        Ok(())
    }

    fn on_collected(&mut self, head: FrameHead, out: &mut BytesMut) -> Result<(), ShimError> {
        self.state = State::FrameHeader { have: 0 };
        let payload = std::mem::take(&mut self.frame_payload);
        let result = self.absorb_fragment(head, &payload);
        // Keep the allocation for the next frame.
        self.frame_payload = payload;
        self.frame_payload.clear();
        result.map_err(|e| self.fail(e))?;
        if head.flags & FLAG_END_HEADERS != 0
            && let Some(block) = self.pending.take()
        {
            self.emit_block(block, out).map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    fn absorb_fragment(&mut self, head: FrameHead, payload: &[u8]) -> Result<(), ShimError> {
        if let Some(pending) = &mut self.pending {
            pending.fragment.extend_from_slice(payload);
            return Ok(());
        }
        // A HEADERS frame (RFC 9113 §6.2): [pad length] [priority] fragment [padding].
        let too_short = ShimError::HeadersFrameTooShort {
            stream_id: head.stream_id,
        };
        let mut body = payload;
        let mut pad_len = 0usize;
        if head.flags & FLAG_PADDED != 0 {
            let (&first, rest) = body.split_first().ok_or_else(|| too_short.clone())?;
            pad_len = usize::from(first);
            body = rest;
        }
        let mut priority = None;
        if head.flags & FLAG_PRIORITY != 0 {
            let fields = body.get(..PRIORITY_LEN).ok_or_else(|| too_short.clone())?;
            let mut raw = [0u8; PRIORITY_LEN];
            raw.copy_from_slice(fields);
            priority = Some(raw);
            body = &body[PRIORITY_LEN..];
        }
        // Padding that fills or exceeds the rest is a PROTOCOL_ERROR (RFC 9113 §6.2).
        let fragment_len = body.len().checked_sub(pad_len).ok_or(too_short)?;
        self.pending = Some(PendingBlock {
            stream_id: head.stream_id,
            end_stream: head.flags & FLAG_END_STREAM != 0,
            priority,
            fragment: body[..fragment_len].to_vec(),
        });
        Ok(())
    }

    fn emit_block(&mut self, block: PendingBlock, out: &mut BytesMut) -> Result<(), ShimError> {
        let fields = self
            .decoder
            .decode(&block.fragment, MAX_HEADER_BLOCK)
            .map_err(|source| ShimError::Hpack {
                stream_id: block.stream_id,
                source,
            })?;
        self.encoded.clear();
        for field in &fields {
            if field.name.as_ref() == b":authority" && !is_valid_authority(&field.value) {
                self.authorities_replaced += 1;
                tracing::debug!(
                    stream_id = block.stream_id,
                    authority = %String::from_utf8_lossy(&field.value),
                    "replacing invalid HTTP/2 :authority with {REPLACEMENT_AUTHORITY}"
                );
                let replaced = HeaderField {
                    value: bytes::Bytes::from_static(REPLACEMENT_AUTHORITY.as_bytes()),
                    ..field.clone()
                };
                hpack::encode_literal_without_indexing(&replaced, &mut self.encoded);
            } else {
                hpack::encode_literal_without_indexing(field, &mut self.encoded);
            }
        }
        write_header_frames(&block, &self.encoded, out);
        Ok(())
    }
}

/// Whether h2 would accept `value` as `:authority` (it parses it as `http::uri::Authority`).
pub fn is_valid_authority(value: &[u8]) -> bool {
    !value.is_empty() && http::uri::Authority::try_from(value).is_ok()
}

/// Writes a HEADERS frame and as many CONTINUATION frames as the block needs.
fn write_header_frames(block: &PendingBlock, encoded: &[u8], out: &mut BytesMut) {
    let priority_len = if block.priority.is_some() {
        PRIORITY_LEN
    } else {
        0
    };
    let first_len = encoded.len().min(MAX_EMITTED_FRAME - priority_len);
    let (first, mut rest) = encoded.split_at(first_len);
    let mut flags = 0u8;
    if block.end_stream {
        flags |= FLAG_END_STREAM;
    }
    if block.priority.is_some() {
        flags |= FLAG_PRIORITY;
    }
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    out.reserve(encoded.len() + FRAME_HEADER_LEN * (2 + encoded.len() / MAX_EMITTED_FRAME) + 5);
    put_frame_head(
        out,
        priority_len + first.len(),
        TYPE_HEADERS,
        flags,
        block.stream_id,
    );
    if let Some(priority) = &block.priority {
        out.put_slice(priority);
    }
    out.put_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_EMITTED_FRAME));
        let flags = if tail.is_empty() { FLAG_END_HEADERS } else { 0 };
        put_frame_head(out, chunk.len(), TYPE_CONTINUATION, flags, block.stream_id);
        out.put_slice(chunk);
        rest = tail;
    }
}

/// Read size for one call into the inner stream.
const READ_CHUNK: usize = 16 * 1024;

/// Passing at least this many payload octets lets the shim read straight into the caller's
/// buffer (large DATA frames) instead of through its own.
const DIRECT_READ_MIN: usize = 1024;

/// Server-side stream wrapper that makes h2 accept any `:authority` (see the module docs).
#[derive(Debug)]
pub struct AuthorityShim<S> {
    inner: S,
    rewriter: InboundRewriter,
    /// Rewritten octets not yet handed to the reader.
    ready: BytesMut,
    scratch: Box<[u8]>,
    eof: bool,
    /// A parse error, reported once the octets rewritten before it have been read.
    failed: Option<ShimError>,
}

impl<S> AuthorityShim<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: InboundRewriter::new(),
            ready: BytesMut::new(),
            scratch: vec![0u8; READ_CHUNK].into_boxed_slice(),
            eof: false,
            failed: None,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    pub fn into_inner(self) -> S {
        self.inner
    }

    /// How many `:authority` values this connection had replaced so far.
    pub fn authorities_replaced(&self) -> u64 {
        self.rewriter.authorities_replaced()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityShim<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = &this.failed {
                return Poll::Ready(Err(e.clone().into()));
            }
            if this.eof || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let budget = this.rewriter.passthrough_budget();
            if budget >= DIRECT_READ_MIN.min(buf.remaining()) && budget > 0 {
                // Payload of a frame we do not rewrite: read it straight into the caller's buffer.
                let want = budget.min(buf.remaining());
                let dst = buf.initialize_unfilled_to(want);
                let mut direct = ReadBuf::new(dst);
                ready!(Pin::new(&mut this.inner).poll_read(cx, &mut direct))?;
                let n = direct.filled().len();
                buf.advance(n);
                if n == 0 {
                    this.eof = true;
                }
                this.rewriter.consume_passthrough(n);
                return Poll::Ready(Ok(()));
            }
            let mut scratch = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut scratch))?;
            if scratch.filled().is_empty() {
                this.eof = true;
                continue;
            }
            if let Err(e) = this.rewriter.feed(scratch.filled(), &mut this.ready) {
                tracing::debug!(error = %e, "closing HTTP/2 connection");
                this.failed = Some(e);
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityShim<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Handlers see the inner stream's connection info (for a `UnixStream`: `UdsConnectInfo` with
/// the peer's credentials), exactly as without the shim.
impl<S: Connected> Connected for AuthorityShim<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
