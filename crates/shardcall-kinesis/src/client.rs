//! The AWS SDK's Kinesis client, built from [`KinesisConfig`].

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::config::{BehaviorVersion, Credentials, Region};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use shardcall::SourceError;
use shardcall_core::PartitionId;

use crate::config::KinesisConfig;

/// A client for `config`: HTTPS through rustls (ring), or plain HTTP to a
/// local endpoint; static credentials from the settings, else from the
/// environment's `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`.
pub(crate) fn client(config: &KinesisConfig) -> Client {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https();
    let (id, secret) = if config.access_key_id.is_empty() {
        (
            std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_default(),
            std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_default(),
        )
    } else {
        (
            config.access_key_id.clone(),
            config.secret_access_key.clone(),
        )
    };
    let mut builder = aws_sdk_kinesis::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(config.region.clone()))
        .credentials_provider(Credentials::new(id, secret, None, None, "shardcall"))
        .http_client(http);
    if let Some(e) = &config.endpoint {
        builder = builder.endpoint_url(e);
    }
    Client::from_conf(builder.build())
}

/// A failed Kinesis call as a source error, its cause kept.
pub(crate) fn failed<E>(operation: &'static str, p: Option<&PartitionId>, e: E) -> SourceError
where
    E: std::error::Error + Send + Sync + 'static,
{
    SourceError::Client {
        system: "kinesis",
        operation,
        partition: p.cloned(),
        source: Box::new(CallFailed {
            text: readable(&e),
            cause: e,
        }),
    }
}

/// An SDK error in one readable line: each cause's own words, joined (the
/// SDK's `DisplayErrorContext` ends with a Debug dump of the response).
fn readable(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut at = Some(e);
    while let Some(err) = at {
        let said = err.to_string();
        if !said.is_empty() && !parts.iter().any(|p| p.contains(&said)) {
            parts.push(said);
        }
        at = err.source();
    }
    parts.join(": ").replace('\n', " ")
}

/// An SDK error that prints its whole chain (the SDK's own display says
/// only "service error"), with the error itself kept as the cause.
#[derive(Debug)]
struct CallFailed<E> {
    text: String,
    cause: E,
}

impl<E> std::fmt::Display for CallFailed<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl<E: std::error::Error + 'static> std::error::Error for CallFailed<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.cause)
    }
}
