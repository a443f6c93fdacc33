//! `devicelet apply -f FILE`: stores DeviceClasses, ResourceSlices, ResourceClaims and
//! ResourceClaimTemplates (`resource.k8s.io/v1`, YAML or JSON, multi-document) in the running
//! daemon (`POST /v1/draobjects`), which keeps them in `R/devicelet/dra_objects.json`.

use std::io::Read;
use std::path::Path;

use anyhow::Context;
use devicelet_rpc::{ControlClient, RootPaths};
use serde::Deserialize;

use crate::cli::ApplyArgs;

/// Parses every non-empty YAML document of `text` into JSON.
pub fn parse_documents(text: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut docs = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = serde_json::Value::deserialize(doc)
            .with_context(|| format!("document {} is not valid YAML", i + 1))?;
        match value {
            serde_json::Value::Null => {}
            serde_json::Value::Object(_) => docs.push(value),
            _ => anyhow::bail!("document {} is not an object", i + 1),
        }
    }
    Ok(docs)
}

/// Runs `apply`.
pub async fn run(root_dir: &Path, args: ApplyArgs) -> anyhow::Result<()> {
    let text = if args.file.as_os_str() == "-" {
        let mut buf = String::new();
        std::io::stdin()
            .read_to_string(&mut buf)
            .context("reading stdin")?;
        buf
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?
    };
    let docs = parse_documents(&text).with_context(|| format!("{}", args.file.display()))?;
    anyhow::ensure!(!docs.is_empty(), "{} holds no objects", args.file.display());
    let client = ControlClient::new(RootPaths::new(root_dir).control_socket);
    for name in client.apply(&docs).await.context("apply")? {
        println!("{name} stored");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_reads_multi_document_yaml() {
        let docs = parse_documents(
            "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: a}\n---\n---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: b}\n",
        )
        .unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1]["kind"], "ResourceClaim");
        assert!(parse_documents("- 1\n").is_err());
    }
}
