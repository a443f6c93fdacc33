//! Property tests and fuzzing of the shim's parser (`InboundRewriter`) and of `AuthorityShim`
//! as an `AsyncRead`: arbitrary input never panics, chunking never changes the result, non-header
//! frames pass through byte for byte, header lists survive decode → re-encode → decode, and the
//! memory caps hold.

mod common;

use bytes::BytesMut;
use common::*;
use devicelet_transport::hpack::{self, HeaderField};
use devicelet_transport::shim::{MAX_EMITTED_FRAME, MAX_HEADER_BLOCK};
use devicelet_transport::{AuthorityShim, InboundRewriter, ShimError};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn feed_chunked(input: &[u8], cuts: &[usize]) -> (Result<(), ShimError>, BytesMut) {
    let mut rewriter = InboundRewriter::new();
    let mut out = BytesMut::new();
    let mut rest = input;
    let mut cuts = cuts.iter().cycle();
    while !rest.is_empty() {
        let n = (*cuts.next().unwrap_or(&1)).clamp(1, rest.len());
        let (chunk, tail) = rest.split_at(n);
        if let Err(e) = rewriter.feed(chunk, &mut out) {
            return (Err(e), out);
        }
        rest = tail;
    }
    (Ok(()), out)
}

/// Splits rewritten output into frames, checking the framing the shim promises.
fn parse_frames(bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut frames = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let head = &bytes[pos..pos + 9];
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let sid = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
        frames.push((
            head[3],
            head[4],
            sid,
            bytes[pos + 9..pos + 9 + len].to_vec(),
        ));
        pos += 9 + len;
    }
    assert_eq!(pos, bytes.len(), "output ends on a frame boundary");
    frames
}

/// Re-assembles the header blocks of rewritten output (no padding, no dynamic table).
fn header_blocks(frames: &[(u8, u8, u32, Vec<u8>)]) -> Vec<(u32, bool, Vec<u8>)> {
    let mut blocks = Vec::new();
    let mut current: Option<(u32, bool, Vec<u8>)> = None;
    for (ty, flags, sid, payload) in frames {
        match *ty {
            TYPE_HEADERS => {
                assert!(current.is_none());
                assert!(payload.len() <= MAX_EMITTED_FRAME);
                assert_eq!(flags & PADDED, 0, "padding is stripped");
                let body = if flags & PRIORITY != 0 {
                    &payload[5..]
                } else {
                    &payload[..]
                };
                current = Some((*sid, flags & END_STREAM != 0, body.to_vec()));
            }
            TYPE_CONTINUATION => {
                assert!(payload.len() <= MAX_EMITTED_FRAME);
                let block = current.as_mut().expect("CONTINUATION follows HEADERS");
                assert_eq!(block.0, *sid);
                block.2.extend_from_slice(payload);
            }
            _ => assert!(current.is_none(), "header block is contiguous"),
        }
        if (*ty == TYPE_HEADERS || *ty == TYPE_CONTINUATION) && flags & END_HEADERS != 0 {
            blocks.push(current.take().expect("END_HEADERS closes an open block"));
        }
    }
    assert!(current.is_none());
    blocks
}

fn arb_name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            ":path",
            ":method",
            ":scheme",
            "content-type",
            "user-agent",
            "te",
            "grpc-timeout",
            "grpc-encoding",
            "authorization",
            "cache-control",
        ])
        .prop_map(str::to_string),
        "[a-z][a-z0-9-]{0,24}",
    ]
}

fn arb_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        "[ -~]{0,64}".prop_map(String::into_bytes),
    ]
}

fn arb_valid_authority() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("localhost".to_string()),
        "[a-z][a-z0-9.-]{0,20}(:[0-9]{1,5})?",
        "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}:[0-9]{2,5}",
    ]
    .prop_filter("must parse", |a| {
        devicelet_transport::shim::is_valid_authority(a.as_bytes())
    })
}

fn arb_repr() -> impl Strategy<Value = Repr> {
    prop_oneof![
        4 => Just(Repr::Indexed),
        1 => Just(Repr::WithoutIndexing),
        1 => Just(Repr::NeverIndexed),
    ]
}

type Block = Vec<(String, Vec<u8>, Repr)>;

fn arb_block(authority: BoxedStrategy<String>) -> impl Strategy<Value = Block> {
    (
        authority,
        arb_repr(),
        prop::collection::vec((arb_name(), arb_value(), arb_repr()), 0..12),
    )
        .prop_map(|(authority, repr, mut rest)| {
            rest.insert(0, (":authority".to_string(), authority.into_bytes(), repr));
            rest
        })
}

/// Encodes `blocks` as a client would (Huffman, dynamic table, optional size update), frames each
/// with random fragment sizes and padding, and returns the connection bytes.
fn client_bytes(
    blocks: &[Block],
    fragment: usize,
    pad: Option<u8>,
    table_size: Option<usize>,
) -> Vec<u8> {
    let mut enc = TestEncoder::default();
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(TYPE_SETTINGS, 0, 0, &[]));
    for (i, block) in blocks.iter().enumerate() {
        let sid = 1 + 2 * i as u32;
        let mut encoded = Vec::new();
        if let (0, Some(size)) = (i, table_size) {
            enc.size_update(size, &mut encoded);
        }
        for (name, value, repr) in block {
            enc.field(name.as_bytes(), value, *repr, &mut encoded);
        }
        let chunks: Vec<&[u8]> = if encoded.is_empty() {
            vec![&[]]
        } else {
            encoded.chunks(fragment).collect()
        };
        for (j, chunk) in chunks.iter().enumerate() {
            let last = j + 1 == chunks.len();
            let mut flags = if last { END_HEADERS } else { 0 };
            if j == 0 {
                flags |= END_STREAM;
                let mut payload = Vec::new();
                if let Some(pad) = pad {
                    flags |= PADDED;
                    payload.push(pad);
                }
                payload.extend_from_slice(chunk);
                payload.extend(std::iter::repeat_n(0xaa, pad.unwrap_or(0) as usize));
                bytes.extend(frame(TYPE_HEADERS, flags, sid, &payload));
            } else {
                bytes.extend(frame(TYPE_CONTINUATION, flags, sid, chunk));
            }
        }
        bytes.extend(frame(TYPE_DATA, END_STREAM, sid, &[0, 0, 0, 0, 0]));
    }
    bytes
}

fn expected_fields(block: &Block, replace_invalid: bool) -> Vec<HeaderField> {
    block
        .iter()
        .map(|(name, value, repr)| {
            let value = if replace_invalid
                && name == ":authority"
                && !devicelet_transport::shim::is_valid_authority(value)
            {
                b"localhost".to_vec()
            } else {
                value.clone()
            };
            HeaderField {
                name: name.clone().into_bytes().into(),
                value: value.into(),
                sensitive: *repr == Repr::NeverIndexed,
            }
        })
        .collect()
}

fn check_round_trip(
    blocks: &[Block],
    fragment: usize,
    pad: Option<u8>,
    table_size: Option<usize>,
    cuts: &[usize],
) -> Result<(), TestCaseError> {
    let input = client_bytes(blocks, fragment, pad, table_size);
    let (result, out) = feed_chunked(&input, cuts);
    prop_assert!(result.is_ok(), "{result:?}");
    prop_assert_eq!(&out[..24], PREFACE);
    let frames = parse_frames(&out[24..]);
    let decoded = header_blocks(&frames);
    prop_assert_eq!(decoded.len(), blocks.len());
    // h2's side: a decoder that is never told to grow a table must decode everything, and its
    // table must stay empty. fluke-hpack is an independent oracle for the same bytes.
    let mut ours = hpack::Decoder::new(hpack::DEFAULT_TABLE_SIZE);
    let mut oracle = fluke_hpack::Decoder::new();
    for (i, ((sid, end_stream, block), input_block)) in decoded.iter().zip(blocks).enumerate() {
        prop_assert_eq!(*sid, 1 + 2 * i as u32);
        prop_assert!(*end_stream);
        let fields = ours
            .decode(block, usize::MAX)
            .expect("our decoder reads the shim output");
        prop_assert_eq!(ours.table_size(), 0);
        prop_assert_eq!(&fields, &expected_fields(input_block, true));
        let oracle_fields = oracle
            .decode(block)
            .expect("fluke-hpack reads the shim output");
        let plain: Vec<(Vec<u8>, Vec<u8>)> = fields
            .iter()
            .map(|f| (f.name.to_vec(), f.value.to_vec()))
            .collect();
        prop_assert_eq!(oracle_fields, plain);
    }
    // DATA frames are untouched.
    let data: Vec<_> = frames.iter().filter(|f| f.0 == TYPE_DATA).collect();
    prop_assert_eq!(data.len(), blocks.len());
    for d in data {
        prop_assert_eq!(&d.3, &vec![0u8, 0, 0, 0, 0]);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Round trip: valid authorities and every other field come out exactly as the client meant
    /// them, whatever the fragmenting, padding, table size and read chunking.
    #[test]
    fn prop_valid_header_lists_round_trip(
        blocks in prop::collection::vec(arb_block(arb_valid_authority().boxed()), 1..5),
        fragment in 1usize..64,
        pad in prop::option::of(any::<u8>()),
        table_size in prop::option::of(0usize..4096),
        cuts in prop::collection::vec(1usize..100, 1..8),
    ) {
        check_round_trip(&blocks, fragment, pad, table_size, &cuts)?;
    }

    /// Any authority string: invalid ones become "localhost", valid ones stay.
    #[test]
    fn prop_any_authority_is_made_acceptable(
        blocks in prop::collection::vec(arb_block("[ -~]{0,40}".boxed()), 1..4),
        fragment in 1usize..300,
        cuts in prop::collection::vec(1usize..500, 1..4),
    ) {
        check_round_trip(&blocks, fragment, None, None, &cuts)?;
    }

    /// Fuzz: arbitrary bytes after the preface never panic, and chunking does not change the
    /// outcome.
    #[test]
    fn prop_arbitrary_bytes_never_panic(
        tail in prop::collection::vec(any::<u8>(), 0..2048),
        cuts in prop::collection::vec(1usize..64, 1..8),
    ) {
        let mut input = PREFACE.to_vec();
        input.extend_from_slice(&tail);
        let (whole, whole_out) = feed_chunked(&input, &[usize::MAX]);
        let (chunked, chunked_out) = feed_chunked(&input, &cuts);
        prop_assert_eq!(whole.is_ok(), chunked.is_ok());
        if whole.is_ok() {
            prop_assert_eq!(whole_out, chunked_out);
        }
    }

    /// Fuzz with frame structure: random frames (header frames included, random flags and
    /// payloads) never panic; when no HEADERS/CONTINUATION is present, output == input.
    #[test]
    fn prop_random_frames_pass_through_or_error(
        frames in prop::collection::vec(
            (prop_oneof![Just(0u8), Just(1), Just(3), Just(4), Just(8), Just(9), any::<u8>()],
             any::<u8>(), 0u32..4, prop::collection::vec(any::<u8>(), 0..64)),
            0..24),
        cuts in prop::collection::vec(1usize..64, 1..8),
    ) {
        let mut input = PREFACE.to_vec();
        for (ty, flags, sid, payload) in &frames {
            input.extend(frame(*ty, *flags, *sid, payload));
        }
        let (result, out) = feed_chunked(&input, &cuts);
        let has_header_frames = frames.iter().any(|f| f.0 == TYPE_HEADERS);
        if !has_header_frames {
            // Stray CONTINUATION frames are passed on for h2 to reject.
            prop_assert!(result.is_ok());
            prop_assert_eq!(&out[..], &input[..]);
        }
    }

    /// Not HTTP/2 prior knowledge: everything passes through unchanged for h2 to reject.
    #[test]
    fn prop_non_preface_input_passes_through(
        input in prop::collection::vec(any::<u8>(), 1..512),
        cuts in prop::collection::vec(1usize..64, 1..8),
    ) {
        prop_assume!(!input.starts_with(&PREFACE[..input.len().min(24)]));
        let (result, out) = feed_chunked(&input, &cuts);
        prop_assert!(result.is_ok());
        prop_assert_eq!(&out[..], &input[..]);
    }
}

#[test]
fn headers_frame_over_the_cap_fails_before_buffering() {
    let mut input = PREFACE.to_vec();
    // Announce a 2 MiB HEADERS frame; only its 9-byte header is sent.
    let len = (2u32 << 20).to_be_bytes();
    input.extend_from_slice(&[len[1], len[2], len[3], TYPE_HEADERS, 0, 0, 0, 0, 1]);
    let mut rewriter = InboundRewriter::new();
    let err = rewriter.feed(&input, &mut BytesMut::new()).unwrap_err();
    assert_eq!(
        err,
        ShimError::HeaderBlockTooLarge {
            stream_id: 1,
            limit: MAX_HEADER_BLOCK
        }
    );
    assert!(err.to_string().contains("exceeds 1048576 bytes"), "{err}");
    // The error sticks.
    assert_eq!(rewriter.feed(b"x", &mut BytesMut::new()), Err(err));
}

#[test]
fn continuation_flood_over_the_cap_fails() {
    let mut rewriter = InboundRewriter::new();
    let mut out = BytesMut::new();
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(TYPE_HEADERS, 0, 1, &[0x82]));
    rewriter.feed(&bytes, &mut out).unwrap();
    let chunk = vec![0x82u8; 16_384];
    let mut result = Ok(());
    for _ in 0..70 {
        result = rewriter.feed(&frame(TYPE_CONTINUATION, 0, 1, &chunk), &mut out);
        if result.is_err() {
            break;
        }
    }
    assert!(
        matches!(result, Err(ShimError::HeaderBlockTooLarge { .. })),
        "{result:?}"
    );
    // Nothing of the unfinished block was emitted.
    assert_eq!(&out[..], PREFACE);
}

#[test]
fn interleaved_frame_inside_a_header_block_is_an_error() {
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(TYPE_HEADERS, 0, 1, &[0x82]));
    bytes.extend(frame(TYPE_DATA, 0, 1, &[1, 2, 3]));
    let err = InboundRewriter::new()
        .feed(&bytes, &mut BytesMut::new())
        .unwrap_err();
    assert_eq!(
        err,
        ShimError::ExpectedContinuation {
            stream_id: 1,
            frame_type: TYPE_DATA,
            got_stream_id: 1
        }
    );
}

#[test]
fn padding_longer_than_the_frame_is_an_error() {
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(TYPE_HEADERS, END_HEADERS | PADDED, 1, &[10, 0x82]));
    let err = InboundRewriter::new()
        .feed(&bytes, &mut BytesMut::new())
        .unwrap_err();
    assert_eq!(err, ShimError::HeadersFrameTooShort { stream_id: 1 });
}

#[tokio::test]
async fn shim_reports_malformed_input_as_invalid_data() {
    let (mut client, server) = tokio::io::duplex(1 << 16);
    let mut shim = AuthorityShim::new(server);
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(
        TYPE_HEADERS,
        END_HEADERS,
        1,
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
    ));
    client.write_all(&bytes).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    let err = loop {
        match shim.read(&mut buf).await {
            Ok(0) => panic!("EOF instead of an error"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => break e,
        }
    };
    assert_eq!(got, PREFACE, "the preface was delivered before the error");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    assert!(err.to_string().contains("stream 1"), "{err}");
}

#[tokio::test]
async fn shim_passes_large_data_frames_through_unchanged() {
    // Exercises the direct-read path (payload read straight into the caller's buffer).
    let mut enc = TestEncoder::default();
    let mut bytes = PREFACE.to_vec();
    let block = enc.encode(&health_check_headers(KUBELET_SOCK_AUTHORITY));
    bytes.extend(frame(TYPE_HEADERS, END_HEADERS, 1, &block));
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    for chunk in payload.chunks(16_384) {
        bytes.extend(frame(TYPE_DATA, 0, 1, chunk));
    }
    bytes.extend(frame(TYPE_DATA, END_STREAM, 1, &[]));
    let expected = {
        let mut out = BytesMut::new();
        InboundRewriter::new().feed(&bytes, &mut out).unwrap();
        out.to_vec()
    };
    for read_size in [7usize, 1000, 65_536] {
        let (mut client, server) = tokio::io::duplex(8192);
        let mut shim = AuthorityShim::new(server);
        let input = bytes.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&input).await.unwrap();
            client.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        let mut buf = vec![0u8; read_size];
        loop {
            let n = shim.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        writer.await.unwrap();
        assert_eq!(got.len(), expected.len(), "read size {read_size}");
        assert!(got == expected, "read size {read_size}");
        assert_eq!(shim.authorities_replaced(), 1);
    }
}
