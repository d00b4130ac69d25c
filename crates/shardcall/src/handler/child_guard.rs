//! No handler process outlives its worker, however the worker ends.
//!
//! Each `--exec` child runs in a process group of its own (so a shell's own
//! children go with it). The worker kills a group when it is done with the
//! child, but a worker can end without running that code: a handler call
//! stuck on a blocking thread when the process exits, or `kill -9`. So the
//! first child starts a guardian: a small `sh` in a process group of its
//! own (terminal signals do not reach it) that reads the groups to guard on
//! its stdin. When the worker ends in any way, the kernel closes that pipe;
//! the guardian reads its end and kills every group still listed.
//!
//! (A `PR_SET_PDEATHSIG` on the child would need `unsafe` in `pre_exec`,
//! reach only the direct child and not the shell's own children, and fire
//! when the *thread* that forked it ends — a blocking-pool thread, which
//! ends when idle. The guardian has none of those limits.)

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// The guardian's script: `+ PGID` adds a group, `- PGID` forgets it; at
/// the end of its input it kills what is left. Builtins only in the loop,
/// so it costs nothing between messages.
const SCRIPT: &str = r#"trap '' INT TERM HUP
live=""
while read -r op pg; do
  case "$op" in
    +) live="$live $pg" ;;
    -) kept=""; for p in $live; do [ "$p" = "$pg" ] || kept="$kept $p"; done; live=$kept ;;
  esac
done
for p in $live; do kill -s KILL -- "-$p" 2>/dev/null; done"#;

struct Guardian {
    /// `None` once ended (or when it could not be started).
    stdin: Option<ChildStdin>,
    child: Option<Child>,
}

/// Started with the first guarded child.
static GUARDIAN: OnceLock<Mutex<Guardian>> = OnceLock::new();

fn guardian() -> &'static Mutex<Guardian> {
    GUARDIAN.get_or_init(|| {
        let started = Command::new("sh")
            .arg("-c")
            .arg(SCRIPT)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
        let guardian = match started {
            Ok(mut child) => Guardian {
                stdin: child.stdin.take(),
                child: Some(child),
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the handler guardian; a handler may outlive a worker killed with -9");
                Guardian {
                    stdin: None,
                    child: None,
                }
            }
        };
        Mutex::new(guardian)
    })
}

fn tell(line: &str) {
    let mut g = guardian().lock().expect("guardian lock");
    if let Some(stdin) = g.stdin.as_mut()
        && stdin.write_all(line.as_bytes()).is_err()
    {
        g.stdin = None;
    }
}

/// Guards `child`, started with `process_group(0)` (its group id is its
/// pid), until [`release`].
pub(crate) fn guard(child: &Child) {
    tell(&format!("+ {}\n", child.id()));
}

/// Stops guarding `child`'s group: call it once the group was killed and
/// the child waited for, so a later process that reuses the id is never
/// touched.
pub(crate) fn release(child: &Child) {
    tell(&format!("- {}\n", child.id()));
}

/// Kills every guarded handler process group now, and returns once the
/// guardian has: for a worker about to exit while a handler call may still
/// be stuck on one of its threads. Children started after this are not
/// guarded.
pub fn end_all() {
    let Some(g) = GUARDIAN.get() else {
        return;
    };
    let mut g = g.lock().expect("guardian lock");
    g.stdin = None; // the end of its input: it kills what it guards and exits
    if let Some(mut child) = g.child.take() {
        let _ = child.wait();
    }
}
