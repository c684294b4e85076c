//! Just enough Markdown for tests/docs.rs: the lines outside code blocks, tables, inline code,
//! links, and headings as GitHub turns them into anchors.

use std::collections::BTreeSet;

/// The lines outside fenced code blocks, with their 1-based line numbers.
pub fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// The contents of the fenced code blocks, each with its lines continued by `\` joined.
pub fn code_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            match current.take() {
                Some(block) => blocks.push(block.replace("\\\n", " ")),
                None => current = Some(String::new()),
            }
            continue;
        }
        if let Some(block) = current.as_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    blocks
}

/// Every `inline code` span of `text` (outside code blocks). A span may go on over a line
/// break inside its paragraph, as GitHub renders it; it then holds a space there.
pub fn inline_code(text: &str) -> Vec<String> {
    let mut spans = Vec::new();
    let mut paragraph = String::new();
    let lines = prose(text);
    for (i, (_, line)) in lines.iter().enumerate() {
        paragraph.push_str(line);
        paragraph.push(' ');
        let ends =
            line.trim().is_empty() || lines.get(i + 1).is_none_or(|(n, l)| *n != lines[i].0 + 1 || l.trim().is_empty());
        if ends {
            spans.extend(backticked(&paragraph).into_iter().map(|s| s.trim().to_string()));
            paragraph.clear();
        }
    }
    spans
}

/// The backticked spans of one line or table cell.
pub fn backticked(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// The cells of a table row (`| a | b \| c |` → ["a", "b | c"]).
pub fn cells(row: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cell = String::new();
    let mut chars = row.trim().trim_start_matches('|').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push('|');
                chars.next();
            }
            '|' => out.push(std::mem::take(&mut cell).trim().to_string()),
            c => cell.push(c),
        }
    }
    if !cell.trim().is_empty() {
        out.push(cell.trim().to_string());
    }
    out
}

/// The body rows of the first table after `marker` whose header row starts with `header`,
/// as cells.
pub fn table(text: &str, marker: &str, header: &str) -> Vec<Vec<String>> {
    let start = text.find(marker).unwrap_or_else(|| panic!("no {marker:?}"));
    let lines: Vec<&str> = text[start..].lines().collect();
    let head = lines
        .iter()
        .position(|l| l.starts_with(header))
        .unwrap_or_else(|| panic!("no table with header {header:?} after {marker:?}"));
    lines[head + 2..].iter().take_while(|l| l.starts_with('|')).map(|l| cells(l)).collect()
}

/// Line numbers where a table is interrupted by a blank line: a row, a blank line, a row.
/// GitHub ends the table at the blank line and shows the rest as text.
pub fn split_tables(text: &str) -> Vec<usize> {
    let lines = prose(text);
    lines
        .windows(3)
        .filter(|w| {
            w[0].1.starts_with('|')
                && w[1].1.trim().is_empty()
                && w[2].1.starts_with('|')
                && w[0].0 + 1 == w[1].0
                && w[1].0 + 1 == w[2].0
        })
        .map(|w| w[1].0)
        .collect()
}

/// Every Markdown link target outside code (`[text](target)`), with its line.
pub fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose(text) {
        // Not inside inline code: `](` in a code span is code, not a link.
        let outside: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = outside.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((n, after[..end].trim().to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// The anchors GitHub gives the headings of `text`: the heading's text without formatting,
/// lowercased, every character but letters, digits, spaces, `-` and `_` dropped, spaces
/// turned into `-`; a repeated anchor gets `-1`, `-2`, … appended.
pub fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (_, line) in prose(text) {
        let Some(title) = heading(line) else { continue };
        let base = slug(&title);
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// The text of an ATX heading (`## Title`), links reduced to their text.
fn heading(line: &str) -> Option<String> {
    let hashes = line.chars().take_while(|c| *c == '#').count();
    if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
        return None;
    }
    let mut title = line[hashes..].trim().trim_end_matches('#').trim().to_string();
    // [text](target) → text
    while let (Some(open), Some(mid)) = (title.find('['), title.find("](")) {
        let Some(close) = title[mid..].find(')').map(|c| mid + c) else { break };
        if open > mid {
            break;
        }
        title = format!("{}{}{}", &title[..open], &title[open + 1..mid], &title[close + 1..]);
    }
    Some(title)
}

pub fn slug(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_follow_githubs_rules() {
        let text = "# The bridge: Manager's database → ManagedWorkloads\n## 3. Verify: `mw-operator check`\n\
                    ## Notes\n## Notes\n```sh\n# not a heading\n```\n## [Linked](x.md) title\n";
        let got = anchors(text);
        for want in [
            "the-bridge-managers-database--managedworkloads",
            "3-verify-mw-operator-check",
            "notes",
            "notes-1",
            "linked-title",
        ] {
            assert!(got.contains(want), "{want} not in {got:?}");
        }
        assert!(!got.contains("not-a-heading"));
    }

    #[test]
    fn inline_code_goes_on_over_a_line_break() {
        let text = "a `b\nc` d\n\n`e`\n```\n`f`\n```\n";
        assert_eq!(inline_code(text), ["b c", "e"]);
    }

    #[test]
    fn cells_keep_escaped_pipes() {
        assert_eq!(cells("| `a\\|b` | c |"), ["`a|b`", "c"]);
    }

    #[test]
    fn links_outside_code_only() {
        let text = "[a](x.md) `[b](y.md)`\n```\n[c](z.md)\n```\n";
        assert_eq!(links(text), [(1, "x.md".to_string())]);
    }

    #[test]
    fn a_blank_line_inside_a_table_is_found() {
        assert_eq!(split_tables("| a |\n|---|\n| 1 |\n\n| 2 |\n"), [4]);
        assert!(split_tables("| a |\n|---|\n| 1 |\n\ntext\n").is_empty());
    }
}
