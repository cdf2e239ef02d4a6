//! Interactive, searchable flame graph (SVG) rendered by inferno from the folded stacks, with
//! a title naming the targets and a subtitle saying how the profile was taken.

use std::{
    io::{self, Write},
    time::Duration,
};

use inferno::flamegraph::{
    self,
    color::{Color, MultiPalette, PaletteMap},
    Options, Palette,
};

use crate::profile::{Profile, ProfileMeta, RunEnd};

/// The colour of the frames where threads wait off the CPU (the `[off-cpu: STATE]` leaves and
/// the kernel functions found only in off-CPU stacks below the code that waited): a blue, apart
/// from the red, orange and yellow of code on the CPU.
const OFF_CPU_COLOR: Color = Color {
    r: 90,
    g: 140,
    b: 230,
};

/// Width of the image in pixels, inferno's default, also used for the empty-profile image.
const IMAGE_WIDTH: usize = 1200;

/// Pids listed per process name in a title before the rest are counted instead.
const TITLE_PIDS: usize = 5;

/// inferno's font size (px) and left and right margins (px), from its defaults.
const FONT_SIZE: usize = 12;
const XPAD: usize = 10;

/// Room for one line of text across the image, in pixels.
const LINE_WIDTH_PX: f64 = (IMAGE_WIDTH - 2 * XPAD) as f64;

/// Advance of one character of inferno's font (`monospace`) in ems: DejaVu Sans Mono and
/// Menlo have 0.602, Courier and Liberation Mono 0.6; characters outside ASCII count as a
/// full em, as wide as the widest of them.
const MONOSPACE_ADVANCE_EM: f64 = 0.61;

/// Width in pixels of `text` at inferno's font and size.
fn text_width_px(text: &str) -> f64 {
    let ems: f64 = text
        .chars()
        .map(|c| {
            if c.is_ascii() {
                MONOSPACE_ADVANCE_EM
            } else {
                1.0
            }
        })
        .sum();
    ems * FONT_SIZE as f64
}

/// `text`, cut with `..` where it would overflow a line.
fn fit_line(text: &str) -> String {
    if text_width_px(text) <= LINE_WIDTH_PX {
        return text.to_string();
    }
    let mut cut = String::new();
    for c in text.chars() {
        cut.push(c);
        if text_width_px(&cut) + text_width_px("..") > LINE_WIDTH_PX {
            cut.pop();
            break;
        }
    }
    cut + ".."
}

/// Writes `profile` as an interactive flame graph, kernel frames in orange.
pub fn write(profile: &Profile, w: &mut impl Write) -> io::Result<()> {
    let title = xml_safe(&title(&profile.meta));
    let subtitle = xml_safe(&subtitle(profile));
    // inferno refuses input without counts (and emits an "ERROR" image first), so an empty
    // run gets its own small image that still says what was profiled.
    if profile.total_weight() == 0 {
        return write_empty(&title, &subtitle, w);
    }

    // The same lines as the folded output, so that the flame graph and a `.folded` file of
    // the same run always agree, kernel `_[k]` annotations included.
    let mut folded = Vec::new();
    super::folded::write(profile, &mut folded)?;
    let folded = String::from_utf8(folded).map_err(io::Error::other)?;
    let lines: Vec<String> = folded.lines().map(xml_safe).collect();

    let mut options = Options::default();
    debug_assert_eq!(options.font_size, FONT_SIZE);
    options.title = title;
    options.subtitle = Some(subtitle);
    // Nanoseconds in a profile with off-CPU time (the folded lines' unit).
    options.count_name = profile.weight_unit().to_string();
    // The Perl palette colors `_[k]` frames orange, C++/Rust (`::`) frames yellow and other
    // code red, without the Java palette's guesses (capitalised or dotted names as Java).
    options.colors = Palette::Multi(MultiPalette::Perl);
    // Colors from a hash of the name instead of a random generator: the same run always
    // renders to the same bytes, and a function keeps its color across flame graphs.
    options.deterministic = true;
    options.image_width = Some(IMAGE_WIDTH);
    let mut off_cpu_colors = off_cpu_palette(profile);
    if let Some(map) = off_cpu_colors.as_mut() {
        options.palette_map = Some(map);
    }
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut svg)?;
    let svg = String::from_utf8(svg).map_err(io::Error::other)?;
    w.write_all(label_root(&svg, &xml_safe(&root_label(profile))).as_bytes())
}

/// Colours for the frames of the waits in a profile with off-CPU time (inferno colours by
/// name: a function seen on the CPU too keeps its usual colour); `None` for a CPU profile.
fn off_cpu_palette(profile: &Profile) -> Option<PaletteMap> {
    profile.meta.off_cpu?;
    let labels = super::folded::frame_labels(profile);
    let mut waiting = std::collections::BTreeSet::new();
    let mut running = std::collections::HashSet::new();
    for stack in &profile.stacks {
        if profile.off_cpu_state(stack).is_some() {
            // The wait: from the last frame of user code (or the root) to the leaf.
            let start = stack
                .frames
                .iter()
                .rposition(|&id| {
                    matches!(&profile.frames[id], crate::profile::ProfileFrame::Code(_))
                        && !profile.frames[id].is_kernel()
                })
                .map_or(0, |i| i + 1);
            waiting.extend(stack.frames[start..].iter().map(|&id| &labels[id]));
        } else {
            running.extend(stack.frames.iter().map(|&id| &labels[id]));
        }
    }
    let mut map = PaletteMap::default();
    for label in waiting.into_iter().filter(|l| !running.contains(l)) {
        map.insert(xml_safe(label), OFF_CPU_COLOR);
    }
    Some(map)
}

/// What the root bar says: all samples, with the run's tags and every loss by reason (the
/// details the one-line subtitle may have had to leave out).
fn root_label(profile: &Profile) -> String {
    let meta = &profile.meta;
    let mut parts = vec![format!("all samples: {}", title(meta))];
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
    parts.push(meta.sampling.describe());
    parts.join(" | ")
}

/// Gives inferno's root bar (`all`, drawn without a label) `label`: as its tooltip, which
/// the zoom script also shows as the bar's text, and as its text, cut to the bar's width.
fn label_root(svg: &str, label: &str) -> String {
    // The root is the `all (N samples, 100%)` frame whose text inferno left empty.
    const ROOT_TITLE: &str = "<title>all (";
    let found = svg.match_indices(ROOT_TITLE).find_map(|(at, _)| {
        let end = at + svg[at..].find("</g>")?;
        let text = at + svg[at..end].find("></text>")?;
        Some((at, text))
    });
    let Some((at, text)) = found else {
        return svg.to_string();
    };
    let shown = fit_line(label);
    format!(
        "{}<title>{} ({}>{}{}",
        &svg[..at],
        escape(label),
        &svg[at + ROOT_TITLE.len()..text],
        escape(&shown),
        &svg[text + 1..]
    )
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

/// One line of how the profile was taken: event and rate, duration, samples, losses, how it
/// ended, and the tags when they fit. It always fits the image: the root bar's tooltip has
/// what it leaves out (tags, and losses by reason when there are too many to list).
fn subtitle(profile: &Profile) -> String {
    let meta = &profile.meta;
    let mut parts = vec![
        meta.sampling.describe(),
        humantime::format_duration(whole_millis(meta.duration)).to_string(),
        format!("{} samples", profile.total_samples()),
    ];
    let losses = meta.losses.nonzero();
    if !losses.is_empty() {
        let listed: Vec<String> = losses
            .iter()
            .map(|(what, n)| format!("{what}: {n}"))
            .collect();
        parts.push(format!("lost or incomplete: {}", listed.join(", ")));
    }
    // A short profile reads differently when the run was cut short: say so.
    match meta.end {
        RunEnd::Completed => {}
        RunEnd::TargetExited => parts.push("ended early: targets exited".to_string()),
        RunEnd::Interrupted => parts.push("ended early: interrupted".to_string()),
    }
    let fits = |parts: &[String]| text_width_px(&parts.join(" | ")) <= LINE_WIDTH_PX;
    // Too long: first the losses become one total, then the sampling loses its fallback
    // note; the root bar's tooltip has both in full.
    if !fits(&parts) && losses.len() > 1 {
        let total: u64 = losses.iter().map(|(_, n)| n).sum();
        parts[3] = format!("lost or incomplete: {total}");
    }
    if !fits(&parts) && meta.sampling.fallback {
        let mut sampling = meta.sampling;
        sampling.fallback = false;
        parts[0] = sampling.describe();
    }
    if !meta.tags.is_empty() {
        let mut with_tags = parts.clone();
        with_tags.insert(3, format!("tags: {}", meta.tag_list(", ")));
        if fits(&with_tags) {
            parts = with_tags;
        }
    }
    fit_line(&parts.join(" | "))
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
        output::fixture,
        profile::{Losses, ProfileFrame, StackCount, Tag},
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
        let mut profile = fixture::profile();
        profile.meta.sampling.fallback = false;
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
        assert_eq!(
            titled("all samples")[0].0,
            "all samples: bpfprof: app (pid 1234) | tags: phase=train \
             | lost or incomplete: truncated stacks: 2 | cpu-clock every 1.001 ms (999 Hz), \
             randomized ±50% (no hardware PMU here: fell back from cycles) (100 samples, 100%)"
        );
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
        profile.frames.push(ProfileFrame::Code(Frame::named(
            "operator<<(std::ostream&, T) \u{7}\u{FFFF}",
            None,
            FrameKind::User,
        )));
        let id = profile.frames.len() - 1;
        profile.stacks.push(StackCount {
            frames: vec![0, 1, 2, id],
            count: 3,
            off_cpu_ns: 0,
            addresses: Vec::new(),
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

    /// A run with every loss, long tags and an early end: the longest subtitle there is.
    fn worst_case() -> Profile {
        let mut profile = fixture::profile();
        let meta = &mut profile.meta;
        meta.tags = (0..6)
            .map(|i| Tag::new(&format!("key{i}"), &"v".repeat(40)).unwrap())
            .collect();
        meta.losses = Losses {
            sample_map_full: 11,
            user_stack_map_full: 12,
            user_stack_error: 13,
            kernel_stack_map_full: 14,
            kernel_stack_error: 15,
            lost_in_transfer: 16,
            truncated: 2,
            stack_ended_early: 17,
            not_profilable: 18,
            off_cpu_pending_full: 19,
            timeline_lost: 20,
        };
        meta.end = RunEnd::Interrupted;
        profile
    }

    #[test]
    fn subtitle_fits_and_keeps_the_losses() {
        let profile = worst_case();
        let sub = subtitle(&profile);
        assert!(
            text_width_px(&sub) <= LINE_WIDTH_PX,
            "{sub:?} is {} px wide",
            text_width_px(&sub)
        );
        assert!(sub.contains("lost or incomplete: 157"), "{sub}");
        assert!(sub.contains("ended early: interrupted"), "{sub}");
        // What did not fit is in the root bar's tooltip.
        let root = root_label(&profile);
        assert!(root.contains("kernel stack unreadable: 15"), "{root}");
        assert!(root.contains("user stacks ended early: 17"), "{root}");
        assert!(root.contains("no longer yours to profile: 18"), "{root}");
        assert!(
            root.contains("off-CPU waits lost: table full: 19"),
            "{root}"
        );
        assert!(
            root.contains("timeline samples lost: ring full: 20"),
            "{root}"
        );
        assert!(root.contains("fell back from cycles"), "{root}");
        assert!(root.contains(&format!("key5={}", "v".repeat(40))), "{root}");
        // A short run keeps everything on the one line.
        let mut profile = fixture::profile();
        profile.meta.sampling.fallback = false;
        let sub = subtitle(&profile);
        assert!(sub.contains("tags: phase=train"), "{sub}");
        assert!(sub.contains("truncated stacks: 2"), "{sub}");
    }

    /// Lays the SVG out in headless Chromium and returns what its script measured: the
    /// subtitle's and the root bar label's boxes, in the image's pixels.
    fn chromium_layout(name: &str, svg: &[u8]) -> Option<Value> {
        let found = Command::new("chromium")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "chromium (package chromium) is required on CI"
            );
            eprintln!("skipped: chromium not found (install chromium)");
            return None;
        }
        let svg = String::from_utf8(svg.to_vec()).unwrap();
        let svg = &svg[svg.find("<svg").unwrap()..];
        let html = format!(
            r##"<!DOCTYPE html><html><body style="margin:0">{svg}<pre id="measured"></pre><script>
const box = (el) => {{ const b = el.getBBox(); return {{ x: b.x, right: b.x + b.width }}; }};
const root = [...document.querySelectorAll("#frames g")]
  .find((g) => g.querySelector("title").textContent.startsWith("all samples"));
const text = root.querySelector("text");
document.getElementById("measured").textContent = JSON.stringify({{
  width: document.querySelector("svg").width.baseVal.value,
  subtitle: box(document.getElementById("subtitle")),
  root_text: text.textContent,
  root_label: box(text),
  root_bar: box(root.querySelector("rect")),
}});
</script></body></html>"##
        );
        let page = std::env::temp_dir().join(format!(
            "bpfprof-svg-test-{}-{name}.html",
            std::process::id()
        ));
        std::fs::write(&page, html).unwrap();
        let out = Command::new("chromium")
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
            .arg(format!("file://{}", page.display()))
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&page);
        let dom = String::from_utf8_lossy(&out.stdout);
        let start = dom
            .find(r#"<pre id="measured">"#)
            .unwrap_or_else(|| panic!("chromium printed no DOM: {dom}"));
        let json = &dom[start + r#"<pre id="measured">"#.len()..];
        let json = &json[..json.find("</pre>").unwrap()];
        Some(serde_json::from_str(&json.replace("&quot;", "\"")).expect("measurements"))
    }

    #[test]
    fn chromium_shows_the_whole_subtitle_and_a_labeled_root() {
        let svg = render(&worst_case());
        let Some(m) = chromium_layout("worst", &svg) else {
            return;
        };
        let width = m["width"].as_f64().unwrap();
        assert_eq!(width, IMAGE_WIDTH as f64);
        let (x, right) = (
            m["subtitle"]["x"].as_f64().unwrap(),
            m["subtitle"]["right"].as_f64().unwrap(),
        );
        assert!(x >= 0.0 && right <= width, "subtitle clipped: {m}");
        let label = m["root_text"].as_str().unwrap();
        assert!(label.starts_with("all samples: bpfprof: app"), "{m}");
        // The label ends within its bar (frames sit in a nested svg offset by the margin).
        let bar_right = m["root_bar"]["right"].as_f64().unwrap();
        assert!(
            m["root_label"]["right"].as_f64().unwrap() <= bar_right,
            "root label overflows its bar: {m}"
        );
    }
}
