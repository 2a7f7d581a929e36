//! The configuration file (`--config FILE` or `PACKRAT_CONFIG`): TOML whose keys are the flags
//! of `packrat serve`, `node` and `gateway` without their dashes (`max-connections = 100`;
//! `max_connections` also works). Keys at the top apply to whichever of those commands reads
//! the file; keys under `[serve]`, `[node]` or `[gateway]` only to that command, over the top
//! ones. A flag on the command line beats its environment variable, which beats the file,
//! which beats the built-in default: the file's values become the flags' defaults, so clap
//! applies that order itself.

use clap::{Arg, ArgAction, Command};
use std::path::Path;

/// The commands that read a configuration file.
pub const SERVER_COMMANDS: [&str; 3] = ["serve", "node", "gateway"];

/// The file named by `--config`/`--config=` in `args`, else by `PACKRAT_CONFIG`.
pub fn path_from(args: &[String]) -> Option<String> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        if a == "--config" {
            return it.next().cloned();
        }
        if let Some(v) = a.strip_prefix("--config=") {
            return Some(v.to_string());
        }
    }
    std::env::var("PACKRAT_CONFIG")
        .ok()
        .filter(|v| !v.is_empty())
}

/// The subcommand `args` run (its first word that is not a flag).
pub fn subcommand_of(args: &[String]) -> Option<&str> {
    args.iter()
        .skip(1)
        .map(String::as_str)
        .find(|a| !a.starts_with('-'))
}

/// `cli` with the defaults of `command`'s flags taken from the file at `path`.
pub fn apply(cli: Command, command: &str, path: &Path) -> Result<Command, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the configuration file {}: {e}", path.display()))?;
    let doc: toml::Table = text
        .parse()
        .map_err(|e| format!("{}: not valid TOML: {e}", path.display()))?;
    let mut settings: Vec<(String, toml::Value)> = Vec::new();
    for (k, v) in &doc {
        if SERVER_COMMANDS.contains(&k.as_str()) {
            continue;
        }
        settings.push((k.clone(), v.clone()));
    }
    for name in SERVER_COMMANDS {
        if let Some(section) = doc.get(name)
            && !section.is_table()
        {
            return Err(format!(
                "{}: [{name}] must be a table of settings",
                path.display()
            ));
        }
    }
    if let Some(toml::Value::Table(t)) = doc.get(command) {
        settings.extend(t.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let Some(sub) = cli.find_subcommand(command).cloned() else {
        return Ok(cli);
    };
    let mut sub = sub;
    for (key, value) in settings {
        let Some(arg) = find_flag(&sub, &key) else {
            // A key of another server command is not this one's business.
            if known_elsewhere(&cli, command, &key) {
                continue;
            }
            return Err(format!(
                "{}: unknown setting `{key}`: no command of packrat has a flag --{}",
                path.display(),
                key.replace('_', "-")
            ));
        };
        let values =
            values_of(&key, &value, arg).map_err(|e| format!("{}: {e}", path.display()))?;
        let id = arg.get_id().clone();
        sub = sub.mut_arg(id, |a| a.default_values(values.clone()).required(false));
    }
    Ok(cli.mut_subcommand(command, |_| sub))
}

/// The flag `key` names: `max-connections` or `max_connections` for --max-connections.
fn find_flag<'a>(cmd: &'a Command, key: &str) -> Option<&'a Arg> {
    let long = key.replace('_', "-");
    cmd.get_arguments()
        .find(|a| a.get_long() == Some(long.as_str()) && long != "config")
}

fn known_elsewhere(cli: &Command, command: &str, key: &str) -> bool {
    SERVER_COMMANDS
        .iter()
        .filter(|c| **c != command)
        .filter_map(|c| cli.find_subcommand(c))
        .any(|c| find_flag(c, key).is_some())
}

/// The flag's values, as text, from a TOML value: strings, numbers and booleans as they are;
/// an array for a flag that may be given more than once.
fn values_of(key: &str, value: &toml::Value, arg: &Arg) -> Result<Vec<String>, String> {
    let many = matches!(arg.get_action(), ArgAction::Append);
    let one = |v: &toml::Value| -> Result<String, String> {
        match v {
            toml::Value::String(s) => Ok(s.clone()),
            toml::Value::Integer(n) => Ok(n.to_string()),
            toml::Value::Float(f) => Ok(f.to_string()),
            toml::Value::Boolean(b) => Ok(b.to_string()),
            _ => Err(format!(
                "`{key}` must be a string, a number or a boolean, not {}",
                v.type_str()
            )),
        }
    };
    match value {
        toml::Value::Array(items) if many => items.iter().map(one).collect(),
        toml::Value::Array(_) => Err(format!(
            "`{key}` takes one value (--{} is not repeatable)",
            key.replace('_', "-")
        )),
        v => Ok(vec![one(v)?]),
    }
}

/// Every flag of `command`, as a TOML file: its help as a comment, and its default value, or
/// commented out when it has none.
pub fn print_default(cli: &Command, command: &str) -> Result<String, String> {
    let sub = cli
        .find_subcommand(command)
        .ok_or_else(|| format!("no command {command}"))?;
    let mut out = format!(
        "# packrat {command}: every flag, as a configuration file (packrat {command} --config FILE).\n\
         # Keys are the flags without their dashes. A flag on the command line, then its\n\
         # PACKRAT_* environment variable, win over what is set here. Keys under [serve],\n\
         # [node] or [gateway] apply to that command only.\n"
    );
    for arg in sub.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if arg.is_hide_set() || matches!(long, "help" | "version" | "config") {
            continue;
        }
        out.push('\n');
        if let Some(help) = arg.get_long_help().or(arg.get_help()) {
            comment(&mut out, &help.to_string());
        }
        if let Some(env) = arg.get_env() {
            out.push_str(&format!("# (environment: {})\n", env.to_string_lossy()));
        }
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let many = matches!(arg.get_action(), ArgAction::Append);
        let flag = matches!(arg.get_action(), ArgAction::SetTrue);
        match (defaults.as_slice(), many, flag) {
            (_, _, true) => out.push_str(&format!("{long} = false\n")),
            ([], true, _) => out.push_str(&format!("# {long} = []\n")),
            ([], false, _) => out.push_str(&format!("# {long} = \"\"\n")),
            (vals, true, _) => out.push_str(&format!(
                "{long} = [{}]\n",
                vals.iter()
                    .map(|v| toml_value(v))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            ([v, ..], false, _) => out.push_str(&format!("{long} = {}\n", toml_value(v))),
        }
    }
    Ok(out)
}

/// `text` as `#` lines of at most about 96 characters.
fn comment(out: &mut String, text: &str) {
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() + 1 + word.len() > 96 && line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
}

/// A default as TOML: numbers and booleans bare, anything else quoted.
fn toml_value(v: &str) -> String {
    let bare = v.parse::<i64>().is_ok()
        || v.parse::<f64>().is_ok_and(f64::is_finite)
        || v == "true"
        || v == "false";
    if bare {
        v.to_string()
    } else {
        toml::Value::String(v.to_string()).to_string()
    }
}
