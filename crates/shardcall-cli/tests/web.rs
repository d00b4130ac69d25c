//! `shardcall web` in a real browser: headless Chromium (Debian's package;
//! the test command installs it) loads the page against a running group of
//! worker processes, and what its DOM shows is checked against
//! `shardcall status --json` of the same group: the members and every
//! partition's phase and holder; after a kill -9, the dead worker's
//! partitions in quarantine with a countdown, then with their new owner.
//! The page's JSON endpoint is checked against `status --json` too, and a
//! missing group and an unreachable Redis are messages on the page. A
//! screenshot goes to the test's output folder.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Rig, member_of, shardcall_command};
use shardcall::CoordinationStore;
use shardcall::eventually::eventually;
use shardcall_redis::RedisStore;

const GROUP: &str = "web";
/// Long enough that a quarantine is still counting down when the browser
/// has loaded the page.
const QUARANTINE_MS: u64 = 9_000;

/// The browser: `SHARDCALL_CHROMIUM`, else Debian's.
fn chromium() -> PathBuf {
    let path = std::env::var_os("SHARDCALL_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    assert!(
        path.exists(),
        "{} is missing: install Debian's chromium package (scripts/test.sh does)",
        path.display()
    );
    path
}

/// Headless Chromium with what this machine needs: no sandbox (tests may
/// run as root), no GPU, nothing fetched from elsewhere, a fresh profile.
fn browser(profile: &Path) -> Command {
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        // The page asks for the view once a second: three answers at most.
        "--virtual-time-budget=2500",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    cmd
}

/// The page's DOM after it has run.
fn dom(profile: &Path, url: &str) -> String {
    let out = browser(profile)
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("chromium runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("data-ready=\"1\""),
        "the page never drew an answer: {text}"
    );
    text
}

/// `name="value"` attributes of each element that has `first`.
fn elements<'a>(dom: &'a str, first: &str) -> Vec<BTreeMap<&'a str, &'a str>> {
    let needle = format!("{first}=\"");
    dom.match_indices(&needle)
        .map(|(at, _)| {
            let start = dom[..at].rfind('<').unwrap();
            let end = at + dom[at..].find('>').unwrap();
            let tag = &dom[start..end];
            let mut attrs = BTreeMap::new();
            let mut rest = tag;
            while let Some(eq) = rest.find("=\"") {
                let name = rest[..eq].rsplit([' ', '<']).next().unwrap();
                let value_end = rest[eq + 2..].find('"').unwrap();
                attrs.insert(name, &rest[eq + 2..eq + 2 + value_end]);
                rest = &rest[eq + 3 + value_end..];
            }
            attrs
        })
        .collect()
}

/// Partition -> (phase, holder) as the page shows them.
fn cells(dom: &str) -> BTreeMap<String, (String, String)> {
    elements(dom, "data-partition")
        .into_iter()
        .filter(|a| a.contains_key("data-phase"))
        .map(|a| {
            (
                a["data-partition"].to_owned(),
                (a["data-phase"].to_owned(), a["data-holder"].to_owned()),
            )
        })
        .collect()
}

/// `shardcall status --json` of the group, given its log (as the page is).
fn status(url: &str, log: &Path) -> serde_json::Value {
    let out = shardcall_command()
        .args([
            "status", "--redis", url, "--group", GROUP, "--json", "--log",
        ])
        .arg(log)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Partition -> (phase, holder) as `status --json` gives them.
fn status_cells(doc: &serde_json::Value) -> BTreeMap<String, (String, String)> {
    doc["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["partition"].as_str().unwrap().to_owned(),
                (
                    r["phase"].as_str().unwrap().to_owned(),
                    r["holder"].as_str().unwrap_or("").to_owned(),
                ),
            )
        })
        .collect()
}

fn status_members(doc: &serde_json::Value) -> BTreeSet<String> {
    doc["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["member"].as_str().unwrap().to_owned())
        .collect()
}

/// `shardcall web`, stopped when dropped.
struct WebServer {
    child: Child,
    url: String,
}

impl WebServer {
    fn start(redis: &str, log: Option<&Path>) -> Self {
        Self::start_with(redis, log, &[])
    }

    fn start_with(redis: &str, log: Option<&Path>, more: &[&str]) -> Self {
        let mut cmd = shardcall_command();
        cmd.args(["web", "--redis", redis, "--group", GROUP])
            .args(["--listen", "127.0.0.1:0"])
            .args(more);
        if let Some(log) = log {
            cmd.arg("--log").arg(log);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        // Its first line says where it serves.
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        Self { child, url }
    }

    /// The root, `http://HOST:PORT`.
    fn root(&self) -> &str {
        self.url.split("/?").next().unwrap().trim_end_matches('/')
    }

    /// A GET of `path`: the status code and the body.
    fn get(&self, path: &str) -> (u16, String) {
        self.request("GET", path, "")
    }

    /// A POST of `path` as the page sends an action.
    fn act(&self, path: &str) -> (u16, String) {
        self.request(
            "POST",
            path,
            "x-shardcall-action: 1\r\nContent-Length: 0\r\n",
        )
    }

    fn request(&self, method: &str, path: &str, headers: &str) -> (u16, String) {
        let host = self.root().trim_start_matches("http://");
        let mut s = std::net::TcpStream::connect(host).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let code = text[9..12].parse().unwrap();
        let body = text.split_once("\r\n\r\n").unwrap().1.to_owned();
        (code, body)
    }
}

impl Drop for WebServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The fields of a `status --json` document that do not move with time.
fn lasting(doc: &serde_json::Value) -> serde_json::Value {
    let rows: Vec<_> = doc["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            serde_json::json!([
                r["partition"],
                r["topic"],
                r["partition_number"],
                r["phase"],
                r["holder"],
                r["epoch"],
                r["offset"],
                r["log_end"],
                r["lag"],
                r["dead_letters"],
                r["target"]
            ])
        })
        .collect();
    serde_json::json!({
        "group": doc["group"],
        "version": doc["version"],
        "members": status_members(doc),
        "quarantine": doc["quarantine"],
        "partitions": rows,
        "tickets": doc["tickets"],
        "lineage": doc["lineage"],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_group_and_a_handover_after_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("chromium");
    let mut rig = Rig::new(dir.path(), 6);
    let url = rig.redis.url();
    let log = dir.path().join("log");
    let store = RedisStore::connect(&url).await.unwrap();
    rig.produce(300, "a");
    // Worker b serves the view beside itself too.
    let beside = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for name in ["a", "b"] {
        let mut cmd = shardcall_command();
        cmd.args(["worker", "--redis", &url, "--group", GROUP, "--topic", "t"])
            .arg("--log")
            .arg(dir.path().join("log"))
            .args(["--name", name, "--ttl-ms", "1500", "--heartbeat-ms", "200"])
            .args(["--margin-ms", "500", "--tick-ms", "100"])
            .args(["--quarantine-ms", &QUARANTINE_MS.to_string()]);
        if name == "b" {
            cmd.args(["--web", &beside.to_string()]);
        }
        rig.workers.start(name, cmd);
    }
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    // Both hold partitions before the page is looked at.
    eventually(Duration::from_secs(30), || async {
        let doc = status(&url, &log);
        let holders: BTreeSet<_> = status_cells(&doc).values().map(|c| c.1.clone()).collect();
        if holders.len() == 2 {
            Ok(())
        } else {
            Err(format!("{holders:?}"))
        }
    })
    .await;
    let web = WebServer::start(&url, Some(&dir.path().join("log")));

    // The page's JSON endpoint is `status --json`.
    let (code, body) = web.get(&format!("/api/status?group={GROUP}"));
    assert_eq!(code, 200, "{body}");
    let served: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(lasting(&served), lasting(&status(&url, &log)));

    // So does the view a worker serves.
    let worker_view = WebServer {
        child: Command::new("true").spawn().unwrap(),
        url: format!("http://{beside}/"),
    };
    let (code, body) = worker_view.get(&format!("/api/status?group={GROUP}"));
    assert_eq!(code, 200, "{body}");
    let served: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(lasting(&served), lasting(&status(&url, &log)));
    drop(worker_view);

    // The page shows what status shows.
    let page = dom(&profile, &web.url);
    let doc = status(&url, &log);
    assert_eq!(cells(&page), status_cells(&doc), "{page}");
    let members: BTreeSet<String> = elements(&page, "data-member")
        .iter()
        .map(|a| a["data-member"].to_owned())
        .collect();
    assert_eq!(members, status_members(&doc));

    // The page's proposed moves are `plan`'s.
    let (_, body) = web.get(&format!("/api/view?group={GROUP}"));
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    let out = shardcall_command()
        .args([
            "plan", "--redis", &url, "--group", GROUP, "--json", "--topic", "t", "--log",
        ])
        .arg(&log)
        .output()
        .unwrap();
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["plan"]["explained"], plan["explained"]);
    assert_eq!(view["plan"]["moves"], plan["moves"]);

    // Once the view knows the group's partitions, a refresh (status and
    // plan alike) costs the store one request.
    eventually(Duration::from_secs(10), || async {
        let (_, body) = web.get(&format!("/api/view?group={GROUP}"));
        let view: serde_json::Value = serde_json::from_str(&body).unwrap();
        match view["store_requests"].as_u64() {
            Some(1) => Ok(()),
            other => Err(format!("{other:?} requests")),
        }
    })
    .await;

    // kill -9: the dead worker's partitions rest in quarantine, counting
    // down, before the other takes them.
    let g = store.load_group(GROUP).await.unwrap();
    let dead = member_of(&g, "a").unwrap();
    let alive = member_of(&g, "b").unwrap();
    let its: BTreeSet<String> = status_cells(&doc)
        .into_iter()
        .filter(|(_, (_, h))| *h == dead)
        .map(|(p, _)| p)
        .collect();
    assert!(!its.is_empty());
    rig.workers.kill_9("a");
    eventually(Duration::from_secs(30), || async {
        let now = status_cells(&status(&url, &log));
        if its.iter().all(|p| now[p].0 == "quarantined") {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    let page = dom(&profile, &web.url);
    let shown = elements(&page, "data-partition");
    for p in &its {
        let cell = shown
            .iter()
            .find(|a| a.get("data-partition") == Some(&p.as_str()) && a.contains_key("data-phase"))
            .unwrap_or_else(|| panic!("{p} not on the page: {page}"));
        assert_eq!(cell["data-phase"], "quarantined", "{p}: {cell:?}");
        let left: u64 = cell["data-left-ms"].parse().unwrap();
        assert!(left > 0 && left <= QUARANTINE_MS, "{p}: {left} ms left");
    }
    let countdowns = elements(&page, "data-left-ms")
        .iter()
        .filter(|a| a.get("class") == Some(&"countdown"))
        .count();
    assert_eq!(
        countdowns,
        its.len(),
        "one countdown per quarantined partition"
    );
    assert!(
        page.contains("left (or its lease lapsed)"),
        "the timeline says the worker left"
    );

    // The page only reads unless told: an action is refused and changes
    // nothing. Told, it releases one quarantine, audited.
    let first = its.iter().next().unwrap().clone();
    let release = format!(
        "/api/release?group={GROUP}&partition={}",
        first.replace('/', "%2F")
    );
    let (code, body) = web.act(&release);
    assert_eq!(code, 403, "{body}");
    assert_eq!(status_cells(&status(&url, &log))[&first].0, "quarantined");
    let acting =
        WebServer::start_with(&url, Some(&log), &["--allow-actions", "--actor", "ops-web"]);
    let (code, body) = acting.request("POST", &release, "Content-Length: 0\r\n");
    assert_eq!(code, 403, "an action without its header: {body}");
    let (code, body) = acting.act(&release);
    assert_eq!(code, 200, "{body}");
    let audit = shardcall_command()
        .args(["audit", "--redis", &url, "--group", GROUP, "--json"])
        .output()
        .unwrap();
    let audit = String::from_utf8_lossy(&audit.stdout);
    assert!(
        audit
            .lines()
            .any(|l| l.contains("ops-web") && l.contains(&first)),
        "the release is audited: {audit}"
    );
    let (code, body) = acting.act(&format!("/api/drain?group={GROUP}&member=nobody"));
    assert!(code == 409 || code == 502, "{code} {body}");
    drop(acting);

    // Then the survivor owns them, and the page says so.
    eventually(Duration::from_secs(30), || async {
        let now = status_cells(&status(&url, &log));
        if its
            .iter()
            .all(|p| now[p] == ("owned".to_owned(), alive.clone()))
        {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    let page = dom(&profile, &web.url);
    let now = cells(&page);
    for p in &its {
        assert_eq!(now[p], ("owned".to_owned(), alive.clone()), "{page}");
    }
    assert!(
        page.contains(&format!("quarantined ({dead}) -&gt; owned ({alive})")),
        "the timeline shows the handover after the quarantine: {page}"
    );

    // A picture of the page, for whoever reads the test's output.
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("web");
    std::fs::create_dir_all(&out).unwrap();
    let shot = out.join("group-after-handover.png");
    let _ = std::fs::remove_file(&shot);
    let status = browser(&profile)
        .arg("--window-size=1280,1000")
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&web.url)
        .status()
        .unwrap();
    assert!(status.success());
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
}

#[test]
fn a_missing_group_and_an_unreachable_redis_are_said_on_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("chromium");
    let redis =
        shardcall_redis::testing::RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let web = WebServer::start(&redis.url(), None);
    let page = dom(&profile, &format!("{}/?group=nosuch", web.root()));
    assert!(page.contains("data-error=\"1\""), "{page}");
    assert!(page.contains("\"nosuch\" does not exist"), "{page}");
    let (code, _) = web.get("/api/view?group=nosuch");
    assert_eq!(code, 404);
    let (code, body) = web.get("/api/view?group=a%7Db");
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("is invalid"), "{body}");
    let (code, _) = web.get("/nowhere");
    assert_eq!(code, 404);

    // Nothing listens here: the page says so (the password never shown).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let gone = format!("redis://:hunter2secret@127.0.0.1:{port}/");
    let web = WebServer::start(&gone, None);
    let page = dom(&profile, &web.url);
    assert!(page.contains("data-error=\"1\""), "{page}");
    assert!(page.contains(&format!("127.0.0.1:{port}")), "{page}");
    assert!(!page.contains("hunter2secret"), "{page}");
}
