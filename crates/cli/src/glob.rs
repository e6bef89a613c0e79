//! Glob matching of lock names for `leasehold list PATTERN`.
//!
//! The pattern is matched against the lock *name* on the client, not handed to Redis as a
//! `SCAN MATCH` on the key: a name is wrapped in braces inside the key unless it carries its
//! own hash tag, so no single key pattern would mean "names matching PATTERN". The syntax is
//! Redis's own (`*`, `?`, `[abc]`, `[a-z]`, `[^x]`, `\` escapes) so operators need not learn
//! another.

/// Whether `text` matches the glob `pattern`.
pub fn matches(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    // Classic backtracking on the last `*` only: linear in practice, never exponential.
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() {
            match pattern[p] {
                '*' => {
                    star = Some((p, t));
                    p += 1;
                    continue;
                }
                '?' => {
                    p += 1;
                    t += 1;
                    continue;
                }
                '[' => {
                    if let Some((hit, next)) = class(&pattern, p, text[t]) {
                        if hit {
                            p = next;
                            t += 1;
                            continue;
                        }
                    } else if text[t] == '[' {
                        // An unclosed `[` is a literal.
                        p += 1;
                        t += 1;
                        continue;
                    }
                }
                '\\' if p + 1 < pattern.len() => {
                    if pattern[p + 1] == text[t] {
                        p += 2;
                        t += 1;
                        continue;
                    }
                }
                c => {
                    if c == text[t] {
                        p += 1;
                        t += 1;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((star_p, star_t)) => {
                p = star_p + 1;
                t = star_t + 1;
                star = Some((star_p, star_t + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

/// Matches `c` against the class starting at `pattern[open] == '['`: `Some((matched, index
/// after the closing bracket))`, or `None` when the class is not closed.
fn class(pattern: &[char], open: usize, c: char) -> Option<(bool, usize)> {
    let mut i = open + 1;
    let negate = matches!(pattern.get(i), Some('^' | '!'));
    if negate {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    loop {
        let here = *pattern.get(i)?;
        if here == ']' && !first {
            return Some((hit != negate, i + 1));
        }
        first = false;
        let (low, step) = if here == '\\' {
            (*pattern.get(i + 1)?, 2)
        } else {
            (here, 1)
        };
        i += step;
        if pattern.get(i) == Some(&'-') && pattern.get(i + 1).is_some_and(|&e| e != ']') {
            let high = *pattern.get(i + 1)?;
            i += 2;
            let (low, high) = if low <= high {
                (low, high)
            } else {
                (high, low)
            };
            hit |= (low..=high).contains(&c);
        } else {
            hit |= low == c;
        }
    }
}

/// `text` with the glob metacharacters escaped, for building a `SCAN MATCH` pattern from a
/// literal (the key prefix).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stars_and_questions() {
        assert!(matches("*", ""));
        assert!(matches("*", "inventory:42"));
        assert!(matches("inventory:*", "inventory:42"));
        assert!(!matches("inventory:*", "report"));
        assert!(matches("*:42", "inventory:42"));
        assert!(matches("i*y:4?", "inventory:42"));
        assert!(!matches("i*y:4?", "inventory:421"));
        assert!(matches("a*b*c", "axxbyyc"));
        assert!(!matches("a*b*c", "axxbyy"));
        assert!(matches("**", "x"));
    }

    #[test]
    fn classes() {
        assert!(matches("job-[abc]", "job-b"));
        assert!(!matches("job-[abc]", "job-d"));
        assert!(matches("job-[a-c]", "job-b"));
        assert!(matches("job-[^a-c]", "job-d"));
        assert!(!matches("job-[!a-c]", "job-a"));
        assert!(matches("x[]]", "x]"));
        assert!(matches("x[", "x["));
    }

    #[test]
    fn escapes() {
        assert!(matches(r"a\*", "a*"));
        assert!(!matches(r"a\*", "ab"));
        assert!(matches(r"\?", "?"));
        assert_eq!(escape("my*app"), r"my\*app");
        assert!(matches(&escape("a[b]*?"), "a[b]*?"));
    }

    #[test]
    fn unicode_names() {
        assert!(matches("在庫:*", "在庫:42"));
        assert!(matches("??:42", "在庫:42"));
    }
}
