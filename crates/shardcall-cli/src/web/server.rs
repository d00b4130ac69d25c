//! The web view's HTTP server: the page and its assets, and three JSON
//! answers — the groups, a group's `status` document, and a group's view
//! (that document, `plan`'s, the audit log and the remembered past).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use shardcall_redis::RedisStore;
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::WebConfig;
use super::actions::{ACTION_HEADER, Action};
use super::history::History;
use crate::commands::group_check::GroupProblem;
use crate::commands::plan::plan_of;
use crate::commands::status::read_status;
use crate::log_opts::{Log, LogOpts};
use crate::redis_opts::RedisOpts;
use crate::views::group::GroupRead;

/// A group is read at most this often, however many pages look at it.
const READ_EVERY: Duration = Duration::from_secs(1);
/// How long a read of the store may take before the page is told.
const READ_BOUND: Duration = Duration::from_secs(5);

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

/// What every request shares.
struct Web {
    redis: RedisOpts,
    /// Who acts from the page, when actions are allowed.
    actor: Option<String>,
    log: LogOpts,
    default_group: Option<String>,
    /// The connection, made when first needed and again after a failure,
    /// so an unreachable Redis is a message on the page, not an exit.
    store: Mutex<Option<RedisStore>>,
    groups: std::sync::Mutex<HashMap<String, Arc<Mutex<GroupView>>>>,
}

/// One group's last read and its remembered past.
#[derive(Default)]
struct GroupView {
    read_at: Option<Instant>,
    answer: Option<(StatusCode, Value)>,
    log: Option<(Vec<String>, Log)>,
    /// The partitions the last read found: read beside the group next
    /// time, so a refresh is one request.
    known: Vec<shardcall_core::PartitionId>,
    history: History,
}

/// Where and how `listener` serves `config`, in words: the address to
/// open, and whether the page may act.
pub(super) fn describe(
    config: &WebConfig,
    listener: &std::net::TcpListener,
) -> anyhow::Result<String> {
    let mut url = format!("serving http://{}/", listener.local_addr()?);
    if let Some(g) = &config.group {
        url.push_str(&format!("?group={g}"));
    }
    let mode = if config.actor.is_some() {
        "drain and release allowed, audited"
    } else {
        "read-only"
    };
    Ok(format!("{url} ({mode}; Ctrl-C stops it)"))
}

/// Serves `config` on `listener` until the process is stopped (on a
/// `LocalSet`: the status read's futures are not all `Send`).
pub(super) async fn serve(
    config: WebConfig,
    listener: std::net::TcpListener,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let web = Arc::new(Web {
        redis: config.redis,
        actor: config.actor,
        log: config.log,
        default_group: config.group,
        store: Mutex::new(None),
        groups: Default::default(),
    });
    loop {
        let (socket, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors and the like: said, then tried again.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let web = web.clone();
        tokio::task::spawn_local(async move {
            let service = hyper::service::service_fn(move |req| {
                let web = web.clone();
                async move { Ok::<_, Infallible>(answer(&web, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(socket), service)
                .await;
        });
    }
}

/// The answer to one request.
async fn answer(web: &Web, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let query = req.uri().query().unwrap_or("");
    let group = query_value(query, "group");
    if req.method() == Method::POST {
        let (status, body) = act(web, &req, group.as_deref()).await;
        return json_response(status, &body);
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return json_response(
            StatusCode::METHOD_NOT_ALLOWED,
            &json!({"error": "the web view answers GET, and POST for actions"}),
        );
    }
    match req.uri().path() {
        "/" | "/index.html" => asset(INDEX_HTML, "text/html; charset=utf-8"),
        "/app.js" => asset(APP_JS, "text/javascript; charset=utf-8"),
        "/style.css" => asset(STYLE_CSS, "text/css; charset=utf-8"),
        "/api/groups" => {
            let (status, body) = groups(web).await;
            json_response(status, &body)
        }
        "/api/status" | "/api/view" => {
            let Some(group) = group.or_else(|| web.default_group.clone()) else {
                return json_response(
                    StatusCode::BAD_REQUEST,
                    &json!({"error": "no group given: add ?group=NAME"}),
                );
            };
            let (status, body) = view(web, &group).await;
            let body = if req.uri().path() == "/api/status" {
                body.get("status").cloned().unwrap_or(body)
            } else {
                body
            };
            json_response(status, &body)
        }
        _ => json_response(StatusCode::NOT_FOUND, &json!({"error": "no such page"})),
    }
}

/// The value of `key` in a query string, as sent (group and member names
/// need no decoding: anything outside their characters is refused as
/// invalid; a partition's slash may come as %2F).
fn query_value(query: &str, key: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_owned())
}

fn asset(text: &'static str, kind: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .header("content-type", kind)
        .header("cache-control", "no-cache")
        .body(Full::new(Bytes::from_static(text.as_bytes())))
        .expect("a static response is valid")
}

fn json_response(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("cache-control", "no-store")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a JSON response is valid")
}

/// The store, connected if it was not.
async fn store(web: &Web) -> anyhow::Result<RedisStore> {
    let mut slot = web.store.lock().await;
    if let Some(s) = slot.as_ref() {
        return Ok(s.clone());
    }
    let s = tokio::time::timeout(READ_BOUND, web.redis.connect())
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "{} did not answer within {} s",
                web.redis.shown(),
                READ_BOUND.as_secs()
            )
        })??;
    *slot = Some(s.clone());
    Ok(s)
}

/// An error as the page shows it; a failed connection is made again on the
/// next read.
async fn failed(web: &Web, e: &anyhow::Error) -> (StatusCode, Value) {
    let status = match e.downcast_ref::<GroupProblem>() {
        Some(GroupProblem::Missing(_)) => StatusCode::NOT_FOUND,
        Some(GroupProblem::InvalidName(_)) => StatusCode::BAD_REQUEST,
        None => {
            *web.store.lock().await = None;
            StatusCode::BAD_GATEWAY
        }
    };
    (status, json!({"error": format!("{e:#}")}))
}

/// Carries out the action a POST asks for, if actions are allowed and the
/// request carries [`ACTION_HEADER`].
async fn act(
    web: &Web,
    req: &Request<hyper::body::Incoming>,
    group: Option<&str>,
) -> (StatusCode, Value) {
    let Some(actor) = &web.actor else {
        return (
            StatusCode::FORBIDDEN,
            json!({"error": "this view is read-only: start shardcall web with --allow-actions to act from the page"}),
        );
    };
    if !req.headers().contains_key(ACTION_HEADER) {
        return (
            StatusCode::FORBIDDEN,
            json!({"error": format!("an action must carry the {ACTION_HEADER} header")}),
        );
    }
    let Some(group) = group else {
        return (
            StatusCode::BAD_REQUEST,
            json!({"error": "no group given: add ?group=NAME"}),
        );
    };
    if let Err(e) = crate::commands::group_check::valid_name(group) {
        return (StatusCode::BAD_REQUEST, json!({"error": format!("{e:#}")}));
    }
    let query = req.uri().query().unwrap_or("");
    let member = query_value(query, "member");
    let partition = query_value(query, "partition");
    let action = match Action::parse(req.uri().path(), member.as_deref(), partition.as_deref()) {
        Ok(a) => a,
        Err(e) => return (StatusCode::BAD_REQUEST, json!({"error": e})),
    };
    let store = match store(web).await {
        Ok(s) => s,
        Err(e) => return failed(web, &e).await,
    };
    let answer = action.run(&store, group, actor).await;
    // The next view reads the group again, so the page shows the effect.
    if let Some(slot) = web.groups.lock().expect("groups lock").get(group)
        && let Ok(mut v) = slot.try_lock()
    {
        v.read_at = None;
    }
    answer
}

/// The groups of this Redis.
async fn groups(web: &Web) -> (StatusCode, Value) {
    let read = async {
        let store = store(web).await?;
        anyhow::Ok(store.group_names().await?)
    };
    match tokio::time::timeout(READ_BOUND, read).await {
        Ok(Ok(names)) => (
            StatusCode::OK,
            json!({
                "groups": names,
                "default_group": web.default_group,
                "actions": web.actor.is_some(),
            }),
        ),
        Ok(Err(e)) => failed(web, &e).await,
        Err(_) => failed(web, &timed_out(web)).await,
    }
}

fn timed_out(web: &Web) -> anyhow::Error {
    anyhow::anyhow!(
        "{} did not answer within {} s",
        web.redis.shown(),
        READ_BOUND.as_secs()
    )
}

/// A group's view: read again when the last read is older than
/// [`READ_EVERY`], else the last answer.
async fn view(web: &Web, group: &str) -> (StatusCode, Value) {
    if let Err(e) = crate::commands::group_check::valid_name(group) {
        return (StatusCode::BAD_REQUEST, json!({"error": format!("{e:#}")}));
    }
    let slot = web
        .groups
        .lock()
        .expect("groups lock")
        .entry(group.to_owned())
        .or_default()
        .clone();
    let mut v = slot.lock().await;
    if let (Some(at), Some(answer)) = (v.read_at, &v.answer)
        && at.elapsed() < READ_EVERY
    {
        return answer.clone();
    }
    let GroupView {
        log,
        known,
        history,
        ..
    } = &mut *v;
    let read = async {
        let store = store(web).await?;
        let group_read = GroupRead::read(&store, group, known)
            .await?
            .existing(group)?;
        known.clone_from(&group_read.parts);
        let read = read_status(&store, group, &group_read, &web.log, log).await?;
        let (topics, opened) = log.as_ref().expect("read_status opens the log");
        let plan = plan_of(&store, group, &group_read, Some(opened), topics, None).await?;
        let status = read.json(group);
        anyhow::Ok((
            status,
            read.audit_json(50),
            plan.json(group),
            group_read.requests,
        ))
    };
    let answer = match tokio::time::timeout(READ_BOUND, read).await {
        Ok(Ok((status, audit, plan, requests))) => {
            history.observe(&status);
            (
                StatusCode::OK,
                json!({
                    "status": status,
                    "audit": audit,
                    "plan": plan,
                    "history": history.json(),
                    "log_given": web.log.given(),
                    // What this read cost the store: one request once the
                    // group's partitions are known.
                    "store_requests": requests,
                }),
            )
        }
        Ok(Err(e)) => failed(web, &e).await,
        Err(_) => failed(web, &timed_out(web)).await,
    };
    v.read_at = Some(shardcall::clock::timer_now());
    v.answer = Some(answer.clone());
    answer
}

#[cfg(test)]
mod tests {
    use super::query_value;

    #[test]
    fn a_query_gives_its_values() {
        assert_eq!(query_value("group=g1&x=2", "group").as_deref(), Some("g1"));
        assert_eq!(query_value("x=2", "group"), None);
        assert_eq!(query_value("", "group"), None);
    }
}
