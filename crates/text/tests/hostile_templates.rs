//! Chat templates are the checkpoint maker's code: a hostile one fails
//! fast, with an error naming the limit it ran into, and the caller is
//! back within the wall-time limit whatever the template does.
//!
//! The binary installs the allocator a worker installs, so the memory
//! budget is enforced here as it is there.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (team rules)

use std::time::{Duration, Instant};

use zinfer_protocol::ChatMessage;
use zinfer_text::{ChatTemplate, TextError, limits};

#[global_allocator]
static ALLOC: limits::TemplateAlloc = limits::TemplateAlloc;

/// The most a hostile render may keep its caller.
const FAST: Duration = Duration::from_secs(2);

fn template(source: &str) -> ChatTemplate {
    ChatTemplate::new(Some(source.to_string()), "<s>".into(), "</s>".into())
}

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
    ]
}

/// Threads of this process named as render threads are.
fn template_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim() == "chat-template")
        .count()
}

/// One test, so that the renders left running (and the memory budget's
/// overrun count, which is process-wide) do not meet another test's.
#[test]
fn hostile_templates_fail_fast_with_the_limit_named() {
    let cases: [(&str, String, &str); 6] = [
        (
            "nested loops",
            "{% for a in range(100000) %}{% for b in range(100000) %}{{ '' }}{% endfor %}{% endfor %}"
                .into(),
            "step limit",
        ),
        (
            "deep recursion",
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}".into(),
            "recursion limit",
        ),
        (
            "output flood",
            "{% for i in range(2000) %}{{ 'x' * 50000 }}{% endfor %}".into(),
            "output limit",
        ),
        (
            "string doubling",
            "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}"
                .into(),
            "memory limit",
        ),
        (
            "slow steps",
            "{% for i in range(3000) %}{% set n = range(100000)|list|length %}{% endfor %}".into(),
            "time limit",
        ),
        (
            "huge template",
            format!("{}{{{{ messages }}}}", "x".repeat(limits::TEMPLATE_BYTES)),
            "size limit",
        ),
    ];
    for (name, source, limit) in &cases {
        // At load: the template cannot render a plain conversation within
        // its limits, so the model is refused, saying which limit.
        let start = Instant::now();
        let t = template(source);
        let load = t.check_limits().unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(&load, TextError::ChatTemplate(m) if m.contains(&format!("exceeded its {limit}"))),
            "{name}: {load}"
        );
        assert!(took < FAST, "{name}: the load waited {took:?}");
        // Requests are refused at once, without running it again.
        let start = Instant::now();
        let err = t.render_messages(&conversation()).unwrap_err().to_string();
        assert!(err.contains(limit), "{name}: {err}");
        assert!(start.elapsed() < Duration::from_millis(50), "{name}");
    }

    // At request time: a template that renders a plain conversation but
    // runs away on a longer one loads, and fails that request alone.
    // (Not the memory case: a thread past its budget sleeps for good, and
    // the load-time case already left one.)
    for (name, source, limit) in [&cases[0], &cases[2], &cases[4]] {
        let t = template(&format!(
            "{{% if messages|length > 2 %}}{source}{{% endif %}}{{{{ messages|length }}}}"
        ));
        t.check_limits().unwrap();
        assert_eq!(t.render_messages(&conversation()).unwrap(), "2");
        let mut longer = conversation();
        longer.push(ChatMessage::new("assistant", "Hello"));
        let start = Instant::now();
        let err = t.render_messages(&longer).unwrap_err().to_string();
        let took = start.elapsed();
        assert!(
            err.contains(&format!("exceeded its {limit}")),
            "{name}: {err}"
        );
        assert!(took < FAST, "{name}: the caller waited {took:?}");
        if *limit == "time limit" {
            // The wait is the wall-time limit, not the template's run,
            // which goes on on a thread of its own: the caller (a worker's
            // socket loop, which sends the heartbeats) is free meanwhile.
            assert!(
                took < limits::WALL_TIME + Duration::from_millis(700),
                "{took:?}"
            );
            assert!(
                template_threads() >= 1,
                "the overrunning render's thread is gone"
            );
        }
    }
    // Ordinary templates still render, and a template that refuses a
    // conversation (its own `raise_exception`) is no limit: it loads.
    let ok = template("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}");
    ok.check_limits().unwrap();
    assert_eq!(
        ok.render_messages(&conversation()).unwrap(),
        "<system>Be brief.<user>Hi"
    );
    let picky = template(
        "{% if messages[0].role == 'system' %}{{ raise_exception('no system turns') }}{% endif %}",
    );
    picky.check_limits().unwrap();
    let err = picky
        .render_messages(&conversation())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no system turns") && !err.contains("exceeded"),
        "{err}"
    );
}
