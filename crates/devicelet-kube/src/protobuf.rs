//! Writes in the Kubernetes protobuf encoding (`application/vnd.kubernetes.protobuf`), as
//! client-go's components send them (`k8s.io/apimachinery/pkg/runtime/serializer/protobuf`:
//! the 4-byte magic `k8s\0`, then a `runtime.Unknown` carrying the object's apiVersion and kind
//! and its message bytes).
//!
//! The API server decodes a protobuf body, and encodes a protobuf answer, for a fraction of the
//! CPU that JSON costs it; on a control plane bound by the API server's CPU that is throughput.
//! Used for the high-volume writes whose answers devicelet does not read back as objects:
//! bindings and events. The messages are the kube-rs project's generated types (`k8s-pb`);
//! the conversions below copy the fields these writes carry from the `k8s-openapi` types.
//! Errors arrive as a `Status` in either encoding and become [`kube::Error::Api`], so callers
//! classify them (`409 Conflict`, `404 NotFound`) exactly as for JSON writes.

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::api::core::v1 as pb_core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use kube::Client;
use kube::core::Status;
use kube::core::response::StatusSummary;
use prost::Message;

/// The protobuf media type.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// Set to `application/json` to keep the node's writes and their answers JSON (the node's
/// `--kube-api-content-type`; for comparison, and for servers behind a proxy that lacks
/// protobuf). The scheduler has `clientConnection.contentType` instead.
pub const CONTENT_TYPE_ENV: &str = "DEVICELET_KUBE_API_CONTENT_TYPE";

/// Whether the node asks for protobuf answers ([`CONTENT_TYPE_ENV`] is not `application/json`).
pub fn node_uses_protobuf() -> bool {
    static PROTOBUF_ANSWERS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PROTOBUF_ANSWERS
        .get_or_init(|| std::env::var(CONTENT_TYPE_ENV).map_or(true, |v| v != "application/json"))
}
/// What a protobuf request accepts back: protobuf, or JSON from a server that lacks it.
const ACCEPT_PROTOBUF: &str = "application/vnd.kubernetes.protobuf, application/json";
/// The prefix of every protobuf-encoded object.
const MAGIC: &[u8; 4] = b"k8s\0";

/// `message` as the body of a protobuf request: magic, then `runtime.Unknown`.
pub fn envelope(api_version: &str, kind: &str, message: &impl Message) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.to_owned()),
            kind: Some(kind.to_owned()),
        }),
        raw: Some(message.encode_to_vec()),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut body = Vec::with_capacity(MAGIC.len() + unknown.encoded_len());
    body.extend_from_slice(MAGIC);
    body.extend_from_slice(&unknown.encode_to_vec());
    body
}

/// The message and type of a protobuf body, or `None` for a body that is not one.
pub fn open_envelope(body: &[u8]) -> Option<Unknown> {
    let rest = body.strip_prefix(MAGIC.as_slice())?;
    Unknown::decode(rest).ok()
}

/// POSTs `body` (an [`envelope`]) to `path` (`/api/v1/namespaces/ns/pods/p/binding`); the
/// answer's object is not read.
pub async fn create(client: &Client, path: &str, body: Vec<u8>) -> Result<(), kube::Error> {
    write(client, http::Method::POST, path, PROTOBUF, body).await
}

/// A strategic-merge PATCH of `path` whose answer is not read: the API server encodes it in
/// protobuf, the cheaper for it, and devicelet never decodes it (the pod status writes).
pub async fn strategic_patch(
    client: &Client,
    path: &str,
    patch: &serde_json::Value,
) -> Result<(), kube::Error> {
    let body = serde_json::to_vec(patch).map_err(kube::Error::SerdeError)?;
    write(
        client,
        http::Method::PATCH,
        path,
        "application/strategic-merge-patch+json",
        body,
    )
    .await
}

/// Sends `body` as `content_type` and reads the answer only when it is an error.
async fn write(
    client: &Client,
    method: http::Method,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> Result<(), kube::Error> {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(CONTENT_TYPE, content_type)
        .header(ACCEPT, ACCEPT_PROTOBUF)
        .body(kube::client::Body::from(body))
        .map_err(kube::Error::HttpError)?;
    let response = client.send(request).await?;
    let code = response.status();
    let json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    // The answer is read to its end even when unused: an HTTP/2 stream whose body is dropped
    // early is reset by the client, and after 1 024 such resets the h2 crate closes the whole
    // connection (every request and watch on it fails at once).
    let bytes = response.into_body().collect().await?.to_bytes();
    if code.is_success() {
        return Ok(());
    }
    Err(kube::Error::Api(
        error_status(code.as_u16(), json, &bytes).boxed(),
    ))
}

/// The `Status` an error answer carries, in either encoding; a body that is neither becomes
/// its text.
fn error_status(code: u16, json: bool, bytes: &Bytes) -> Status {
    if json && let Ok(status) = serde_json::from_slice::<Status>(bytes) {
        return status;
    }
    if let Some(status) = open_envelope(bytes)
        .and_then(|u| u.raw)
        .and_then(|raw| pb_meta::Status::decode(raw.as_slice()).ok())
    {
        return Status {
            status: Some(StatusSummary::Failure),
            code: status
                .code
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(code),
            message: status.message.unwrap_or_default(),
            reason: status.reason.unwrap_or_default(),
            metadata: None,
            details: None,
        };
    }
    Status::failure(String::from_utf8_lossy(bytes).trim(), "").with_code(code)
}

/// The protobuf `Binding`.
pub fn binding(b: &core::Binding) -> pb_core::Binding {
    pb_core::Binding {
        metadata: Some(object_meta(&b.metadata)),
        target: Some(object_reference(&b.target)),
    }
}

/// The protobuf core/v1 `Event`.
pub fn event(e: &core::Event) -> pb_core::Event {
    pb_core::Event {
        metadata: Some(object_meta(&e.metadata)),
        involved_object: Some(object_reference(&e.involved_object)),
        reason: e.reason.clone(),
        message: e.message.clone(),
        source: e.source.as_ref().map(|s| pb_core::EventSource {
            component: s.component.clone(),
            host: s.host.clone(),
        }),
        first_timestamp: e.first_timestamp.as_ref().map(|t| time(&t.0)),
        last_timestamp: e.last_timestamp.as_ref().map(|t| time(&t.0)),
        count: e.count,
        r#type: e.type_.clone(),
        event_time: e.event_time.as_ref().map(|t| micro_time(&t.0)),
        series: e.series.as_ref().map(|s| pb_core::EventSeries {
            count: s.count,
            last_observed_time: s.last_observed_time.as_ref().map(|t| micro_time(&t.0)),
        }),
        action: e.action.clone(),
        related: e.related.as_ref().map(object_reference),
        reporting_component: e.reporting_component.clone(),
        reporting_instance: e.reporting_instance.clone(),
    }
}

fn micro_time(t: &k8s_openapi::jiff::Timestamp) -> pb_meta::MicroTime {
    let t = time(t);
    pb_meta::MicroTime {
        seconds: t.seconds,
        nanos: t.nanos,
    }
}

fn time(t: &k8s_openapi::jiff::Timestamp) -> pb_meta::Time {
    pb_meta::Time {
        seconds: Some(t.as_second()),
        nanos: Some(t.subsec_nanosecond()),
    }
}

/// The metadata a created object may carry: names, labels, annotations, owners, finalizers.
fn object_meta(m: &meta::ObjectMeta) -> pb_meta::ObjectMeta {
    pb_meta::ObjectMeta {
        name: m.name.clone(),
        generate_name: m.generate_name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        resource_version: m.resource_version.clone(),
        labels: m.labels.clone().unwrap_or_default().into_iter().collect(),
        annotations: m
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        owner_references: m
            .owner_references
            .iter()
            .flatten()
            .map(|o| pb_meta::OwnerReference {
                api_version: Some(o.api_version.clone()),
                kind: Some(o.kind.clone()),
                name: Some(o.name.clone()),
                uid: Some(o.uid.clone()),
                controller: o.controller,
                block_owner_deletion: o.block_owner_deletion,
            })
            .collect(),
        finalizers: m.finalizers.clone().unwrap_or_default(),
        ..pb_meta::ObjectMeta::default()
    }
}

fn object_reference(r: &core::ObjectReference) -> pb_core::ObjectReference {
    pb_core::ObjectReference {
        kind: r.kind.clone(),
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        uid: r.uid.clone(),
        api_version: r.api_version.clone(),
        resource_version: r.resource_version.clone(),
        field_path: r.field_path.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};

    #[test]
    fn envelope_carries_magic_type_and_message() {
        let b = core::Binding {
            metadata: meta::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u-1".into()),
                ..Default::default()
            },
            target: core::ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some("node-1".into()),
                ..Default::default()
            },
        };
        let body = envelope("v1", "Binding", &binding(&b));
        assert_eq!(&body[..4], b"k8s\0");
        let unknown = open_envelope(&body).expect("an envelope");
        let type_meta = unknown.type_meta.expect("type meta");
        assert_eq!(type_meta.api_version.as_deref(), Some("v1"));
        assert_eq!(type_meta.kind.as_deref(), Some("Binding"));
        let decoded =
            pb_core::Binding::decode(unknown.raw.expect("raw").as_slice()).expect("decode");
        let meta = decoded.metadata.expect("metadata");
        assert_eq!(meta.name.as_deref(), Some("p"));
        assert_eq!(meta.uid.as_deref(), Some("u-1"));
        assert_eq!(
            decoded.target.and_then(|t| t.name).as_deref(),
            Some("node-1")
        );
        assert!(open_envelope(b"{\"kind\":\"Binding\"}").is_none());
    }

    #[test]
    fn event_times_keep_seconds_and_nanoseconds() {
        let at: k8s_openapi::jiff::Timestamp =
            "2026-11-28T12:00:01.123456789Z".parse().expect("time");
        let e = core::Event {
            first_timestamp: Some(Time(at)),
            event_time: Some(MicroTime(at)),
            type_: Some("Normal".into()),
            count: Some(3),
            ..Default::default()
        };
        let pb = event(&e);
        let first = pb.first_timestamp.expect("first");
        assert_eq!(first.seconds, Some(at.as_second()));
        assert_eq!(first.nanos, Some(123_456_789));
        assert_eq!(pb.event_time.and_then(|t| t.nanos), Some(123_456_789));
        assert_eq!(pb.r#type.as_deref(), Some("Normal"));
        assert_eq!(pb.count, Some(3));
    }

    #[test]
    fn errors_decode_from_either_encoding() {
        let json = Bytes::from_static(
            br#"{"kind":"Status","status":"Failure","message":"pods \"p\" is already assigned","reason":"Conflict","code":409}"#,
        );
        let s = error_status(409, true, &json);
        assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
        let pb_status = pb_meta::Status {
            status: Some("Failure".into()),
            message: Some("not found".into()),
            reason: Some("NotFound".into()),
            code: Some(404),
            ..Default::default()
        };
        let body = Bytes::from(envelope("v1", "Status", &pb_status));
        let s = error_status(404, false, &body);
        assert_eq!(
            (s.code, s.reason.as_str(), s.message.as_str()),
            (404, "NotFound", "not found")
        );
        let s = error_status(502, false, &Bytes::from_static(b"bad gateway"));
        assert_eq!((s.code, s.message.as_str()), (502, "bad gateway"));
    }
}
