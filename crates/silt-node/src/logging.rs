//! Logging of every process (the daemon roles and the Python SDK): `tracing` events on
//! stderr, as text for people or, with `log_format = json`, one JSON object a line for a log
//! pipeline. The `silt: ...` status lines that scripts wait for are `eprintln!`s, not events:
//! they stay plain text in both formats.
//!
//! A JSON line holds `timestamp` (RFC 3339, UTC), `level`, `target`, `message`, `fields` (the
//! event's own, when it has any), `spans` (the spans it happened in, outermost first, with
//! their fields), `role` (`up`, `mount`, `worker`, `gateway`, `python`), `pid`, and `worker`
//! (a worker's id, once known).

use std::fmt;
use std::sync::OnceLock;

use serde_json::{Map, Value};
use silt_common::config::{Config, LogFormat};
use tracing::field::{Field, Visit};
use tracing::span::Record;
use tracing::{Event, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

static WORKER_ID: OnceLock<String> = OnceLock::new();

/// Logs to stderr in `cfg.log_format`, with the filter in environment variable `env` if set,
/// else `cfg.log`, else `fallback` when that does not parse; `role` names this process in
/// JSON lines. Also sets the repeat interval of rate-limited warnings. A second call only
/// does the latter.
pub fn init_logging(cfg: &Config, role: &'static str, env: &str, fallback: &str) {
    silt_common::log::set_repeat_interval(cfg.log_repeat_interval);
    let filter = tracing_subscriber::EnvFilter::try_from_env(env)
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cfg.log))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(fallback));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match cfg.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .fmt_fields(JsonFields)
            .event_format(JsonLines { role })
            .try_init(),
    };
}

/// A worker's id, in every JSON line from now on (a worker learns it after logging starts).
pub fn set_log_worker_id(id: &str) {
    let _ = WORKER_ID.set(id.to_string());
}

/// The JSON line of one event.
pub struct JsonLines {
    pub role: &'static str,
}

impl<S> FormatEvent<S, JsonFields> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = JsonVisitor::default();
        event.record(&mut fields);
        let meta = event.metadata();
        let mut time = String::new();
        SystemTime.format_time(&mut Writer::new(&mut time))?;
        // Records of the `log` crate (from dependencies) carry their real target as a field.
        let target = fields.log_target.take();
        write!(
            w,
            "{{\"timestamp\":{},\"level\":{},\"target\":{},\"message\":{}",
            json_str(&time),
            json_str(meta.level().as_str()),
            json_str(target.as_deref().unwrap_or(meta.target())),
            json_str(fields.message.as_deref().unwrap_or("")),
        )?;
        if !fields.map.is_empty() {
            write!(w, ",\"fields\":{}", Value::Object(fields.map))?;
        }
        if let Some(scope) = ctx.event_scope() {
            let mut first = true;
            for span in scope.from_root() {
                w.write_str(if first { ",\"spans\":[" } else { "," })?;
                first = false;
                write!(w, "{{\"name\":{}", json_str(span.name()))?;
                let ext = span.extensions();
                // Written by `JsonFields`: a JSON object, "{}" for a span without fields.
                if let Some(f) = ext.get::<FormattedFields<JsonFields>>() {
                    if f.fields.len() > 2 {
                        write!(w, ",\"fields\":{}", f.fields)?;
                    }
                }
                w.write_char('}')?;
            }
            if !first {
                w.write_char(']')?;
            }
        }
        write!(
            w,
            ",\"role\":{},\"pid\":{}",
            json_str(self.role),
            // Read per line: a forked process (a DataLoader worker) logs its own.
            std::process::id()
        )?;
        if let Some(id) = WORKER_ID.get() {
            write!(w, ",\"worker\":{}", json_str(id))?;
        }
        writeln!(w, "}}")
    }
}

/// Span fields as a JSON object (what `JsonLines` puts in `spans`).
pub struct JsonFields;

impl<'w> FormatFields<'w> for JsonFields {
    fn format_fields<R: RecordFields>(&self, mut w: Writer<'w>, fields: R) -> fmt::Result {
        let mut v = JsonVisitor::default();
        fields.record(&mut v);
        write!(w, "{}", Value::Object(v.into_map()))
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &Record<'_>,
    ) -> fmt::Result {
        let mut v = JsonVisitor {
            map: serde_json::from_str(&current.fields).unwrap_or_default(),
            ..Default::default()
        };
        fields.record(&mut v);
        current.fields = Value::Object(v.into_map()).to_string();
        Ok(())
    }
}

fn json_str(s: &str) -> Value {
    Value::String(s.to_string())
}

/// Fields as JSON values: numbers and booleans as such, everything else as text.
#[derive(Default)]
struct JsonVisitor {
    message: Option<String>,
    log_target: Option<String>,
    map: Map<String, Value>,
}

impl JsonVisitor {
    fn put(&mut self, field: &Field, value: Value) {
        match field.name() {
            "message" => {
                self.message = Some(match value {
                    Value::String(s) => s,
                    other => other.to_string(),
                })
            }
            "log.target" => self.log_target = value.as_str().map(str::to_string),
            // The `log` crate's module, file and line: the target says where from.
            name if name.starts_with("log.") => {}
            name => {
                self.map.insert(name.to_string(), value);
            }
        }
    }

    /// The fields with the message among them (a span's).
    fn into_map(mut self) -> Map<String, Value> {
        if let Some(m) = self.message.take() {
            self.map.insert("message".into(), Value::String(m));
        }
        self.map
    }
}

impl Visit for JsonVisitor {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, json_str(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::String(value.to_string()));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        let v = i64::try_from(value).map_or_else(|_| Value::String(value.to_string()), Value::from);
        self.put(field, v);
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        let v = u64::try_from(value).map_or_else(|_| Value::String(value.to_string()), Value::from);
        self.put(field, v);
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // NaN and infinities have no JSON number: null.
        self.put(field, value.into());
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    /// Collects what the subscriber writes.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Runs `f` with a JSON subscriber for this thread; the lines it logged, parsed.
    fn json_lines(f: impl FnOnce()) -> Vec<Value> {
        let sink = Sink::default();
        let out = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("debug")
            .with_writer(move || out.clone())
            .fmt_fields(JsonFields)
            .event_format(JsonLines { role: "test" })
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
            .collect()
    }

    #[test]
    fn an_event_is_one_json_object_with_its_fields_and_spans() {
        let lines = json_lines(|| {
            let outer = tracing::info_span!("mount", path = "/data", n = 3u64);
            let _o = outer.enter();
            let inner = tracing::debug_span!("read", offset = tracing::field::Empty);
            inner.record("offset", 4096u64);
            let _i = inner.enter();
            let e = io::Error::other("no space left");
            tracing::warn!(
                tier = %"disk0",
                pages = 7u64,
                ratio = 0.5,
                ok = false,
                error = %e,
                "cannot write a cache page: \"quoted\"\nnext line"
            );
            tracing::info!("plain");
        });
        assert_eq!(lines.len(), 2, "{lines:?}");
        let l = &lines[0];
        assert_eq!(l["level"], "WARN");
        assert_eq!(l["target"], module_path!());
        assert_eq!(
            l["message"],
            "cannot write a cache page: \"quoted\"\nnext line"
        );
        assert_eq!(l["fields"]["tier"], "disk0");
        assert_eq!(l["fields"]["pages"], 7);
        assert_eq!(l["fields"]["ratio"], 0.5);
        assert_eq!(l["fields"]["ok"], false);
        assert_eq!(l["fields"]["error"], "no space left");
        assert_eq!(l["role"], "test");
        assert_eq!(l["pid"], std::process::id());
        let ts = l["timestamp"].as_str().unwrap();
        // RFC 3339 in UTC: 2025-01-02T03:04:05.678901Z
        assert!(
            ts.len() == 27 && ts.ends_with('Z') && &ts[10..11] == "T",
            "{ts}"
        );
        assert_eq!(l["spans"][0]["name"], "mount");
        assert_eq!(l["spans"][0]["fields"]["path"], "/data");
        assert_eq!(l["spans"][0]["fields"]["n"], 3);
        assert_eq!(l["spans"][1]["name"], "read");
        assert_eq!(l["spans"][1]["fields"]["offset"], 4096);
        let plain = &lines[1];
        assert_eq!(plain["message"], "plain");
        assert!(plain.get("fields").is_none(), "{plain}");
    }

    #[test]
    fn a_repeating_warning_is_logged_once_then_counted() {
        silt_common::log::set_repeat_interval(Duration::from_secs(3600));
        let lines = json_lines(|| {
            for i in 0..5u64 {
                silt_common::warn_limited!(per: "tier-a", "disk full", page = i);
            }
            silt_common::warn_limited!(per: "tier-b", "disk full", page = 0u64);
            silt_common::log::flush();
        });
        let msgs: Vec<(&str, Option<u64>, Option<u64>)> = lines
            .iter()
            .map(|l| {
                (
                    l["message"].as_str().unwrap(),
                    l["fields"]["page"].as_u64(),
                    l["fields"]["suppressed"].as_u64(),
                )
            })
            .collect();
        assert_eq!(
            msgs,
            [
                ("disk full", Some(0), None),
                ("disk full", Some(0), None),
                ("disk full", None, Some(4)),
            ]
        );
        assert!(lines[2]["fields"]["site"]
            .as_str()
            .unwrap()
            .contains("logging.rs:"));
    }
}
