//! End-to-end checks of `AuthorityShim` (spec/devicemanager.md §1.11, spec/ecosystem.md A11
//! row 63): a real tonic health server on a Unix socket in a temp dir, driven by a raw HTTP/2
//! client that sends the `:authority` values real Go clients send.

mod common;

use common::*;
use devicelet_transport::hpack;

fn serving() -> Outcome {
    Outcome::Grpc {
        status: "0".into(),
        body: SERVING_BODY.to_vec(),
    }
}

#[tokio::test]
async fn a11_go_client_authorities_get_a_grpc_answer_through_the_shim() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path(), "kubelet.sock", true).await;
    for (i, authority) in [
        KUBELET_SOCK_AUTHORITY,
        "var/lib/kubelet/x.sock",
        "",
        "localhost",
    ]
    .into_iter()
    .enumerate()
    {
        // A fresh connection per authority: each is what one Go client generation sends.
        let mut client = RawClient::connect(&server.path).await;
        assert_eq!(
            client.health_check(1, authority).await,
            serving(),
            "authority {authority:?} (case {i})"
        );
    }
    assert_eq!(server.seen.lock().unwrap().requests, 4);
    server.stop().await;
}

#[tokio::test]
async fn a11_path_authority_is_rejected_without_the_shim() {
    // Proves the shim is needed: plain tonic over UnixListenerStream resets the stream.
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path(), "plain.sock", false).await;
    let mut client = RawClient::connect(&server.path).await;
    assert_eq!(
        client.health_check(1, KUBELET_SOCK_AUTHORITY).await,
        Outcome::Reset(1),
        "h2 answers RST_STREAM PROTOCOL_ERROR"
    );
    drop(client);
    // A valid authority on the same unshimmed server works, so the failure is the authority.
    let mut client = RawClient::connect(&server.path).await;
    assert_eq!(client.health_check(1, "localhost").await, serving());
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn a11_second_request_references_first_authority_by_dynamic_index() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path(), "kubelet.sock", true).await;
    let mut client = RawClient::connect(&server.path).await;
    assert_eq!(
        client.health_check(1, KUBELET_SOCK_AUTHORITY).await,
        serving()
    );
    // The first block inserted :path, :authority, user-agent, te, ... into the client's table.
    let inserted = client.encoder.dynamic_len();
    assert!(inserted >= 4, "first request populated the dynamic table");
    let block = client
        .encoder
        .encode(&health_check_headers(KUBELET_SOCK_AUTHORITY));
    // Every field is now a one-octet index; the authority one points into the dynamic table.
    assert_eq!(block.len(), 7, "second block is all indexed: {block:02x?}");
    assert!(block.iter().any(|&b| b >= 0x80 | 62));
    client
        .send(&frame(TYPE_HEADERS, END_HEADERS, 3, &block))
        .await;
    client.send_empty_request_body(3).await;
    assert_eq!(client.outcome(3).await, serving());
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn a11_table_size_updates_and_literal_kinds_are_tracked() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path(), "kubelet.sock", true).await;
    let mut client = RawClient::connect(&server.path).await;
    // Block 1: shrink the table to 0 then grow to 256 (two updates at the start), then mix
    // representations.
    let mut block = Vec::new();
    client.encoder.size_update(0, &mut block);
    client.encoder.size_update(256, &mut block);
    for (name, value) in health_check_headers("var/lib/kubelet/x.sock") {
        let repr = match name {
            ":authority" => Repr::NeverIndexed,
            "user-agent" => Repr::WithoutIndexing,
            _ => Repr::Indexed,
        };
        client
            .encoder
            .field(name.as_bytes(), value.as_bytes(), repr, &mut block);
    }
    client
        .send(&frame(TYPE_HEADERS, END_HEADERS, 1, &block))
        .await;
    client.send_empty_request_body(1).await;
    assert_eq!(client.outcome(1).await, serving());
    // Block 2 relies on what survived in the 256-octet table.
    let outcome = client.health_check(3, "var/lib/kubelet/x.sock").await;
    assert_eq!(outcome, serving());
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn a11_padded_headers_with_priority_get_a_grpc_answer() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path(), "kubelet.sock", true).await;
    let mut client = RawClient::connect(&server.path).await;
    let block = client
        .encoder
        .encode(&health_check_headers(KUBELET_SOCK_AUTHORITY));
    let pad = 37u8;
    let mut payload = vec![pad];
    payload.extend_from_slice(&[0, 0, 0, 0, 15]); // depends on stream 0, weight 16
    payload.extend_from_slice(&block);
    payload.extend(std::iter::repeat_n(0u8, pad as usize));
    client
        .send(&frame(
            TYPE_HEADERS,
            END_HEADERS | PADDED | PRIORITY,
            1,
            &payload,
        ))
        .await;
    client.send_empty_request_body(1).await;
    assert_eq!(client.outcome(1).await, serving());
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn a11_header_block_split_across_continuation_frames() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path(), "kubelet.sock", true).await;
    let mut client = RawClient::connect(&server.path).await;
    let block = client
        .encoder
        .encode(&health_check_headers(KUBELET_SOCK_AUTHORITY));
    // Cut in three, in the middle of Huffman strings, and write the frames in odd pieces.
    let (a, rest) = block.split_at(5);
    let (b, c) = rest.split_at(rest.len() / 2);
    let mut bytes = frame(TYPE_HEADERS, 0, 1, a);
    bytes.extend(frame(TYPE_CONTINUATION, 0, 1, b));
    bytes.extend(frame(TYPE_CONTINUATION, END_HEADERS, 1, c));
    for piece in bytes.chunks(7) {
        client.send(piece).await;
    }
    client.send_empty_request_body(1).await;
    assert_eq!(client.outcome(1).await, serving());
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn a11_large_header_block_is_re_emitted_as_headers_plus_continuation() {
    let dir = tempfile::tempdir().unwrap();
    // The server must accept a ~40 KB header list (hyper's default limit is 16 KiB).
    let builder = tonic::transport::Server::builder().http2_max_header_list_size(Some(1 << 20));
    let server = TestServer::start_with(dir.path(), "kubelet.sock", true, builder).await;
    let mut client = RawClient::connect(&server.path).await;
    // Huffman-friendly 40 KB value: compresses well, so the re-encoded (raw) block is larger
    // than what the client sent and must be split into more frames by the shim.
    let big = "a".repeat(40_000);
    let mut headers = health_check_headers(KUBELET_SOCK_AUTHORITY);
    headers.push(("x-big", &big));
    let mut block = Vec::new();
    for (n, v) in &headers {
        client.encoder.field(
            n.as_bytes(),
            v.as_bytes(),
            Repr::WithoutIndexing,
            &mut block,
        );
    }
    assert!(block.len() < 30_000 && block.len() > 16_384);
    let (first, rest) = block.split_at(16_384);
    let mut bytes = frame(TYPE_HEADERS, 0, 1, first);
    bytes.extend(frame(TYPE_CONTINUATION, END_HEADERS, 1, rest));
    client.send(&bytes).await;
    client.send_empty_request_body(1).await;
    assert_eq!(client.outcome(1).await, serving());
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn a11_malformed_hpack_closes_the_connection_without_killing_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path(), "kubelet.sock", true).await;
    let mut client = RawClient::connect(&server.path).await;
    // Index 70 does not exist (empty dynamic table).
    client
        .send(&frame(
            TYPE_HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &[0x80 | 70],
        ))
        .await;
    let outcome = client.outcome(1).await;
    assert!(
        matches!(outcome, Outcome::Closed | Outcome::GoAway(_)),
        "{outcome:?}"
    );
    // The server keeps serving other connections.
    let mut client = RawClient::connect(&server.path).await;
    assert_eq!(
        client.health_check(1, KUBELET_SOCK_AUTHORITY).await,
        serving()
    );
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn a11_handlers_see_the_peer_credentials_through_the_shim() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path(), "kubelet.sock", true).await;
    let mut client = RawClient::connect(&server.path).await;
    assert_eq!(client.health_check(1, "").await, serving());
    assert_eq!(
        server.seen.lock().unwrap().peer_pid,
        Some(std::process::id() as i32)
    );
    drop(client);
    server.stop().await;
}

#[test]
fn a11_shim_output_for_a_path_authority_is_what_h2_accepts() {
    // Byte-level check of one rewritten block: HEADERS frame, literal fields, localhost.
    let mut enc = TestEncoder::default();
    let block = enc.encode(&health_check_headers(KUBELET_SOCK_AUTHORITY));
    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_HEADERS, END_HEADERS, 1, &block));
    let mut rewriter = devicelet_transport::InboundRewriter::new();
    let mut out = bytes::BytesMut::new();
    rewriter.feed(&input, &mut out).unwrap();
    assert_eq!(rewriter.authorities_replaced(), 1);
    assert_eq!(&out[..24], PREFACE);
    let head = &out[24..33];
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    assert_eq!((head[3], head[4]), (TYPE_HEADERS, END_HEADERS));
    assert_eq!(out.len(), 33 + len);
    let fields = hpack::Decoder::new(4096)
        .decode(&out[33..], 1 << 20)
        .unwrap();
    let authority: Vec<_> = fields
        .iter()
        .filter(|f| f.name.as_ref() == b":authority")
        .collect();
    assert_eq!(authority.len(), 1);
    assert_eq!(authority[0].value.as_ref(), b"localhost");
    // Every field is a literal without indexing (first octet 0000xxxx).
    let mut pos = 0;
    let body = &out[33..];
    while pos < body.len() {
        assert_eq!(body[pos] & 0xf0, 0x00, "literal without indexing at {pos}");
        let (name_index, used) = hpack::decode_integer(&body[pos..], 4).unwrap();
        pos += used;
        if name_index == 0 {
            pos += hpack::decode_string(&body[pos..]).unwrap().1;
        }
        pos += hpack::decode_string(&body[pos..]).unwrap().1;
    }
}
