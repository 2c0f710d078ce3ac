//! The `captf` command line (SPEC section 9).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "captf", version, about = "CAPTF: Cluster API infrastructure from Terraform modules")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the three CustomResourceDefinitions as YAML.
    Crds,
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    match cli.command {
        Command::Crds => {
            print!("{}", crds_yaml());
            ExitCode::SUCCESS
        }
    }
}

/// The CRDs as one multi-document YAML stream.
pub fn crds_yaml() -> String {
    let mut out = String::new();
    for crd in crate::api::crds() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd).expect("a CRD always serializes"));
    }
    out
}
