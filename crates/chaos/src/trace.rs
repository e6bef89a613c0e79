//! The library's own log (tracing: lease lost, renewal failed, rollback failed...) written to
//! `trace-c{client}-g{gen}.log` beside the client's events, each line stamped with the run's
//! clock, so a finding can be traced into the library's view of it.

use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

use crate::clock::now_us;

struct FileSubscriber {
    file: Mutex<File>,
}

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, " {value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

impl Subscriber for FileSubscriber {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::DEBUG && metadata.target().starts_with("leasehold")
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        let mut line = Line(format!("{} {} {}:", now_us(), meta.level(), meta.target()));
        event.record(&mut line);
        line.0.push('\n');
        if let Ok(mut file) = self.file.lock() {
            let _ = file.write_all(line.0.as_bytes());
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Sends every leasehold log event of this process to `path`.
pub fn log_to(path: &Path) -> anyhow::Result<()> {
    let file = File::create(path)?;
    tracing::subscriber::set_global_default(FileSubscriber {
        file: Mutex::new(file),
    })?;
    Ok(())
}
