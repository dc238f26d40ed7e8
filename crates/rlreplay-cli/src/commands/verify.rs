//! `rlreplay verify`: grade `{"gold": ..., "pred": ...}` lines with the math verifier.

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rlreplay_reward::{verify_batch, Limits, MathVerifier, Mode};

/// Arguments of `rlreplay verify`.
#[derive(clap::Args)]
pub struct Args {
    /// JSONL file of `{"gold": ..., "pred": ...}` objects (`-` for standard input).
    #[arg(long)]
    input: PathBuf,
    /// Reward configuration: `maxrl` (gold boxed and read as LaTeX, prediction as expression then
    /// LaTeX), `default` (math-verify's library defaults) or `intent` (maxrl plus the rules of a
    /// careful human grader).
    #[arg(long, default_value = "maxrl")]
    mode: Mode,
    /// Time limit per answer, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
}

fn field(
    obj: &serde_json::Map<String, serde_json::Value>,
    key: &str,
    line: usize,
) -> anyhow::Result<String> {
    match obj.get(key) {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(serde_json::Value::Number(n)) => Ok(n.to_string()),
        Some(other) => bail!("line {line}: `{key}` must be a string or a number, found {other}"),
        None => bail!("line {line}: missing key `{key}`"),
    }
}

/// Reads the (gold, pred) pairs; a malformed line is an error naming the line (1-based).
fn read_pairs(reader: impl Read, name: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    for (i, line) in BufReader::new(reader).lines().enumerate() {
        let n = i + 1;
        let line = line.with_context(|| format!("{name}: reading line {n}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(&line)
            .with_context(|| format!("{name}: line {n} is not valid JSON"))?;
        let Some(obj) = value.as_object() else {
            bail!("{name}: line {n} is not a JSON object");
        };
        let gold = field(obj, "gold", n).with_context(|| name.to_string())?;
        let pred = field(obj, "pred", n).with_context(|| name.to_string())?;
        pairs.push((gold, pred));
    }
    Ok(pairs)
}

/// Runs `rlreplay verify`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let name = args.input.display().to_string();
    let pairs = if name == "-" {
        read_pairs(std::io::stdin().lock(), "<stdin>")?
    } else {
        let file = std::fs::File::open(&args.input).with_context(|| format!("opening {name}"))?;
        read_pairs(file, &name)?
    };
    let verifier = MathVerifier {
        mode: args.mode,
        limits: Limits {
            time: Duration::from_millis(args.timeout_ms),
            ..Limits::default()
        },
    };
    let start = Instant::now();
    let verdicts = verify_batch(&verifier, &pairs);
    let secs = start.elapsed().as_secs_f64();
    let mut out = BufWriter::new(std::io::stdout().lock());
    for v in &verdicts {
        writeln!(
            out,
            "{{\"verdict\": {}, \"reward\": {:.1}}}",
            v.correct,
            v.reward()
        )?;
    }
    out.flush()?;
    let correct = verdicts.iter().filter(|v| v.correct).count();
    let timeouts = verdicts.iter().filter(|v| v.timed_out).count();
    let unparsed = verdicts.iter().filter(|v| v.gold_unparsed).count();
    let bounded = verdicts.iter().filter(|v| v.bounded).count();
    eprintln!(
        "{} answers ({:?} mode): {} correct, {} incorrect ({} timed out, {} gold unparsable, {} over a nesting or size bound); {:.3} s, {:.0} answers/s",
        verdicts.len(),
        args.mode,
        correct,
        verdicts.len() - correct,
        timeouts,
        unparsed,
        bounded,
        secs,
        verdicts.len() as f64 / secs.max(1e-9),
    );
    Ok(ExitCode::SUCCESS)
}
