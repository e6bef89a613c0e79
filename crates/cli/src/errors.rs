//! How a failure reaches the operator: one line on stderr, no backtrace.
//!
//! Errors arrive as chains (our context, the library's error, fred's, the OS's). Printing the
//! chain with `{:#}` repeats text when a layer already includes its cause in its own message
//! (the library's connection error does), and fred renders OS errors with their `Debug` form
//! (`Os { code: 111, kind: ConnectionRefused, message: "Connection refused" }`). This module
//! joins the chain without repeats and keeps just the OS's message.

/// The whole chain of `error` on one line.
pub fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = tidy(&cause.to_string());
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line.replace(['\n', '\r'], " ")
}

/// Drops fred's `IO Error: ` tags and turns `Debug`-printed OS errors into their message.
fn tidy(text: &str) -> String {
    let mut text = text.replace("IO Error: ", "");
    for (open, field) in [("Os {", "message: \""), ("Custom {", "error: \"")] {
        while let Some(start) = text.find(open) {
            let Some(end) = text[start..].find(" }").map(|e| start + e + 2) else {
                break;
            };
            let inner = &text[start..end];
            let message = inner
                .find(field)
                .map(|m| &inner[m + field.len()..])
                .and_then(|rest| rest.rfind('"').map(|q| rest[..q].to_string()))
                .unwrap_or_default();
            text.replace_range(start..end, &message);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_errors_read_as_messages() {
        let fred = r#"IO Error: cannot connect to Redis at 127.0.0.1:1: IO Error: Os { code: 111, kind: ConnectionRefused, message: "Connection refused" } (is redis-server running?)"#;
        assert_eq!(
            tidy(fred),
            "cannot connect to Redis at 127.0.0.1:1: Connection refused (is redis-server running?)"
        );
        let custom = r#"IO Error: Custom { kind: Uncategorized, error: "failed to lookup address information: Name or service not known" }"#;
        assert_eq!(
            tidy(custom),
            "failed to lookup address information: Name or service not known"
        );
        assert_eq!(tidy("plain"), "plain");
    }

    #[test]
    fn chains_do_not_repeat() {
        let error = anyhow::anyhow!("inner detail")
            .context("outer: inner detail")
            .context("top");
        assert_eq!(one_line(&error), "top: outer: inner detail");
    }
}
