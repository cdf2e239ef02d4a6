//! Interactive, searchable flame graph (SVG) rendered by inferno from the folded stacks, with
//! a title naming the targets and a subtitle saying how the profile was taken.

use std::{
    io::{self, Write},
    time::Duration,
};

use inferno::flamegraph::{self, color::MultiPalette, Options, Palette};

use crate::aggregate::{Profile, ProfileMeta, RunEnd};

/// Width of the image in pixels, inferno's default, also used for the empty-profile image.
const IMAGE_WIDTH: usize = 1200;

/// Pids listed per process name in a title before the rest are counted instead.
const TITLE_PIDS: usize = 5;

/// Writes `profile` as an interactive flame graph, kernel frames in orange.
pub fn write(profile: &Profile, w: &mut impl Write) -> io::Result<()> {
    let title = xml_safe(&title(&profile.meta));
    let subtitle = xml_safe(&subtitle(profile));
    // inferno refuses input without counts (and emits an "ERROR" image first), so an empty
    // run gets its own small image that still says what was profiled.
    if profile.total_samples() == 0 {
        return write_empty(&title, &subtitle, w);
    }

    // The same lines as the folded output, so that the flame graph and a `.folded` file of
    // the same run always agree, kernel `_[k]` annotations included.
    let mut folded = Vec::new();
    super::folded::write(profile, &mut folded)?;
    let folded = String::from_utf8(folded).map_err(io::Error::other)?;
    let lines: Vec<String> = folded.lines().map(xml_safe).collect();

    let mut options = Options::default();
    options.title = title;
    options.subtitle = Some(subtitle);
    options.count_name = "samples".to_string();
    // The Perl palette colors `_[k]` frames orange, C++/Rust (`::`) frames yellow and other
    // code red, without the Java palette's guesses (capitalised or dotted names as Java).
    options.colors = Palette::Multi(MultiPalette::Perl);
    // Colors from a hash of the name instead of a random generator: the same run always
    // renders to the same bytes, and a function keeps its color across flame graphs.
    options.deterministic = true;
    options.image_width = Some(IMAGE_WIDTH);
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut *w)
}

/// The title of every rendering of a profile: `bpfprof: app (pid 1, 2), other (pid 3)`.
pub(crate) fn title(meta: &ProfileMeta) -> String {
    // Several targets often share a name (workers of one service): group their pids.
    let mut groups: Vec<(&str, Vec<u32>)> = Vec::new();
    for target in &meta.targets {
        match groups.iter_mut().find(|(comm, _)| *comm == target.comm) {
            Some((_, pids)) => pids.push(target.pid),
            None => groups.push((&target.comm, vec![target.pid])),
        }
    }
    if groups.is_empty() {
        return "bpfprof".to_string();
    }
    let groups: Vec<String> = groups
        .iter()
        .map(|(comm, pids)| {
            let mut listed: Vec<String> = pids
                .iter()
                .take(TITLE_PIDS)
                .map(|p| p.to_string())
                .collect();
            if pids.len() > TITLE_PIDS {
                listed.push(format!("+{} more", pids.len() - TITLE_PIDS));
            }
            format!("{comm} (pid {})", listed.join(", "))
        })
        .collect();
    format!("bpfprof: {}", groups.join(", "))
}

/// One line of how the profile was taken: event and rate, duration, samples, tags, losses.
fn subtitle(profile: &Profile) -> String {
    let meta = &profile.meta;
    let mut parts = vec![
        meta.sampling.describe(),
        humantime::format_duration(whole_millis(meta.duration)).to_string(),
        format!("{} samples", profile.total_samples()),
    ];
    if !meta.tags.is_empty() {
        parts.push(format!("tags: {}", meta.tag_list(", ")));
    }
    let losses = meta.losses.nonzero();
    if !losses.is_empty() {
        let losses: Vec<String> = losses
            .iter()
            .map(|(what, n)| format!("{what}: {n}"))
            .collect();
        parts.push(format!("lost or incomplete: {}", losses.join(", ")));
    }
    // A short profile reads differently when the run was cut short: say so.
    match meta.end {
        RunEnd::Completed => {}
        RunEnd::TargetExited => parts.push("ended early: targets exited".to_string()),
        RunEnd::Interrupted => parts.push("ended early: interrupted".to_string()),
    }
    parts.join(" | ")
}

/// Sub-millisecond digits would only clutter the subtitle (`1s 2ms 345us 678ns`).
fn whole_millis(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Writes a small valid SVG that says the profile has no samples.
fn write_empty(title: &str, subtitle: &str, w: &mut impl Write) -> io::Result<()> {
    let height = 110;
    writeln!(w, r#"<?xml version="1.0" standalone="no"?>"#)?;
    writeln!(
        w,
        r#"<svg version="1.1" width="{IMAGE_WIDTH}" height="{height}" viewBox="0 0 {IMAGE_WIDTH} {height}" xmlns="http://www.w3.org/2000/svg">"#
    )?;
    writeln!(
        w,
        r##"<rect x="0" y="0" width="100%" height="100%" fill="#eeeeee"/>"##
    )?;
    let text = |id: &str, y: usize, size: usize, content: &str| {
        format!(
            r#"<text id="{id}" x="50%" y="{y}" text-anchor="middle" font-family="Verdana" font-size="{size}">{}</text>"#,
            escape(content)
        )
    };
    writeln!(w, "{}", text("title", 24, 17, title))?;
    writeln!(w, "{}", text("subtitle", 48, 12, subtitle))?;
    writeln!(w, "{}", text("details", 84, 14, "no samples"))?;
    writeln!(w, "</svg>")
}

/// Escapes text for XML character data.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// Replaces characters XML 1.0 forbids (most control characters, which process and thread
/// names may hold), since neither inferno nor any SVG viewer accepts them, even escaped.
fn xml_safe(s: &str) -> String {
    let allowed = |c: char| {
        matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{FFFE}' && c != '\u{FFFF}')
    };
    s.chars()
        .map(|c| if allowed(c) { c } else { '\u{FFFD}' })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::{
        path::{Path, PathBuf},
        process::Command,
    };

    use serde_json::Value;

    use super::*;
    use crate::{
        aggregate::{ProfileFrame, StackCount},
        output::fixture,
        symbolize::{Frame, FrameKind},
    };

    /// Whether `tool` runs; when it does not, the test is skipped, except on CI where a
    /// missing validator would silently stop validating.
    fn have_tool(tool: &str, package: &str) -> bool {
        let found = Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "{tool} (package {package}) is required on CI"
            );
            eprintln!("skipped: {tool} not found (install {package})");
        }
        found
    }

    fn render(profile: &Profile) -> Vec<u8> {
        let mut out = Vec::new();
        write(profile, &mut out).unwrap();
        out
    }

    /// A file in the temporary directory, removed when dropped.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, contents: &[u8]) -> TempFile {
            let path = std::env::temp_dir().join(format!(
                "bpfprof-svg-test-{}-{name}.svg",
                std::process::id()
            ));
            std::fs::write(&path, contents).unwrap();
            TempFile(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// Checks well-formedness with xmllint, then reads the SVG with Python's XML parser:
    /// `None` when a tool is missing (off CI).
    fn parse_svg(name: &str, svg: &[u8]) -> Option<Value> {
        if !have_tool("xmllint", "libxml2-utils") || !have_tool("python3", "python3") {
            return None;
        }
        let file = TempFile::new(name, svg);
        let lint = Command::new("xmllint")
            .arg("--noout")
            .arg(&file.0)
            .output()
            .unwrap();
        assert!(
            lint.status.success(),
            "xmllint rejects the SVG: {}",
            String::from_utf8_lossy(&lint.stderr)
        );
        Some(python_extract(&file.0))
    }

    /// The title, subtitle, every text and every frame (tooltip and fill) as Python sees them.
    fn python_extract(path: &Path) -> Value {
        const SCRIPT: &str = r#"
import json, sys
import xml.etree.ElementTree as ET
NS = '{http://www.w3.org/2000/svg}'
root = ET.parse(sys.argv[1]).getroot()
out = {'root': root.tag, 'title': None, 'subtitle': None, 'texts': [], 'frames': []}
for el in root.iter():
    if el.tag == NS + 'text':
        text = ''.join(el.itertext())
        out['texts'].append(text)
        if el.get('id') in ('title', 'subtitle'):
            out[el.get('id')] = text
    elif el.tag == NS + 'g':
        title = el.find(NS + 'title')
        rect = el.find(NS + 'rect')
        if title is not None and rect is not None:
            out['frames'].append({'title': ''.join(title.itertext()), 'fill': rect.get('fill')})
print(json.dumps(out))
"#;
        let output = Command::new("python3")
            .args(["-c", SCRIPT])
            .arg(path)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "python's XML parser rejects the SVG: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap()
    }

    fn frames(parsed: &Value) -> Vec<(String, String)> {
        parsed["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["title"].as_str().unwrap().to_string(),
                    f["fill"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    /// The samples a tooltip such as `leaf_hot (60 samples, 60.00%)` reports.
    fn tooltip_samples(title: &str) -> u64 {
        let counts = title.rsplit_once(" (").unwrap().1;
        counts
            .split(' ')
            .next()
            .unwrap()
            .replace(',', "")
            .parse()
            .unwrap()
    }

    fn rgb(fill: &str) -> (u8, u8, u8) {
        let inner = fill
            .strip_prefix("rgb(")
            .unwrap()
            .strip_suffix(')')
            .unwrap();
        let c: Vec<u8> = inner
            .split(',')
            .map(|c| c.trim().parse().unwrap())
            .collect();
        (c[0], c[1], c[2])
    }

    #[test]
    fn title_and_subtitle_describe_the_run() {
        let profile = fixture::profile();
        assert_eq!(title(&profile.meta), "bpfprof: app (pid 1234)");
        let sub = subtitle(&profile);
        assert!(sub.starts_with("cpu-clock every "), "{sub}");
        for part in [
            "100ms",
            "100 samples",
            "tags: phase=train",
            "truncated stacks: 2",
        ] {
            assert!(sub.contains(part), "{part:?} missing from {sub:?}");
        }
    }

    #[test]
    fn title_groups_pids_by_name() {
        let mut meta = fixture::profile().meta;
        let target = meta.targets[0].clone();
        for (pid, comm) in [(1, "app"), (2, "db"), (3, "app")] {
            let mut t = target.clone();
            t.pid = pid;
            t.comm = comm.into();
            meta.targets.push(t);
        }
        assert_eq!(title(&meta), "bpfprof: app (pid 1234, 1, 3), db (pid 2)");
        meta.targets.clear();
        assert_eq!(title(&meta), "bpfprof");
    }

    #[test]
    fn renders_a_valid_searchable_flame_graph() {
        let profile = fixture::profile();
        let svg = render(&profile);
        assert_eq!(svg, render(&profile), "output must be deterministic");
        let text = String::from_utf8(svg.clone()).unwrap();
        assert!(text.contains("function search("), "search script missing");

        let Some(parsed) = parse_svg("fixture", &svg) else {
            return;
        };
        assert_eq!(parsed["root"], "{http://www.w3.org/2000/svg}svg");
        let title = parsed["title"].as_str().unwrap();
        assert!(title.contains("app"), "{title}");
        let subtitle = parsed["subtitle"].as_str().unwrap();
        assert!(subtitle.contains("cpu-clock"), "{subtitle}");

        let frames = frames(&parsed);
        let titled = |prefix: &str| -> Vec<&(String, String)> {
            frames
                .iter()
                .filter(|(t, _)| t.starts_with(prefix))
                .collect()
        };
        // leaf_hot is drawn twice (under parent_hot and under recursion): 60 + 10 samples.
        // The fixture's frames carry lines, as with --line-numbers, so labels name them.
        let hot = titled("leaf_hot (");
        assert!(
            hot.iter()
                .any(|(t, _)| t == "leaf_hot (app.c:30) (60 samples, 60.00%)"),
            "{hot:?}"
        );
        assert_eq!(hot.iter().map(|(t, _)| tooltip_samples(t)).sum::<u64>(), 70);
        assert_eq!(titled("all (")[0].0, "all (100 samples, 100%)");
        assert_eq!(
            titled("[truncated] (")[0].0,
            "[truncated] (2 samples, 2.00%)"
        );
        assert_eq!(
            titled("[phase=train] (")[0].0,
            "[phase=train] (100 samples, 100.00%)"
        );

        // The `_[k]` annotation is shown stripped, and only changes the color: orange has no
        // blue, the palette's red has equal green and blue.
        let (kernel_title, kernel_fill) = titled("sys_write")[0];
        assert_eq!(kernel_title, "sys_write (8 samples, 8.00%)");
        assert_eq!(
            rgb(kernel_fill).2,
            0,
            "kernel frame not orange: {kernel_fill}"
        );
        let (_, g, b) = rgb(&hot[0].1);
        assert_eq!(g, b, "user frame not red: {}", hot[0].1);
        assert!(!text.contains("_[k]"), "annotation shown in the image");
    }

    #[test]
    fn odd_names_stay_valid_xml() {
        let mut profile = fixture::profile();
        profile.meta.targets[0].comm = "a<b>&\"c\u{1}".into();
        profile.frames.push(ProfileFrame::Code(Frame {
            name: "operator<<(std::ostream&, T) \u{7}\u{FFFF}".into(),
            module: None,
            kind: FrameKind::User,
            inlined: false,
            file: None,
            line: None,
            build_id: None,
        }));
        let id = profile.frames.len() - 1;
        profile.stacks.push(StackCount {
            frames: vec![0, 1, 2, id],
            count: 3,
        });
        let svg = render(&profile);
        let Some(parsed) = parse_svg("odd-names", &svg) else {
            return;
        };
        let title = parsed["title"].as_str().unwrap();
        assert!(title.contains("a<b>&\"c\u{FFFD}"), "{title}");
        assert!(frames(&parsed).iter().any(
            |(t, _)| t.starts_with("operator<<(std::ostream&, T) \u{FFFD}\u{FFFD} (3 samples")
        ));
    }

    #[test]
    fn empty_profile_is_a_valid_svg() {
        let mut profile = fixture::profile();
        profile.stacks.clear();
        profile.meta.losses = Default::default();
        let svg = render(&profile);
        let Some(parsed) = parse_svg("empty", &svg) else {
            return;
        };
        assert_eq!(parsed["root"], "{http://www.w3.org/2000/svg}svg");
        assert_eq!(parsed["title"], "bpfprof: app (pid 1234)");
        let subtitle = parsed["subtitle"].as_str().unwrap();
        assert!(
            subtitle.contains("cpu-clock") && subtitle.contains("0 samples"),
            "{subtitle}"
        );
        assert!(!subtitle.contains("lost"), "{subtitle}");
        assert!(parsed["texts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "no samples"));
    }
}
