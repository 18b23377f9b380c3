//! sluice: a model gateway. One base URL serves many language and embedding models
//! from many providers.
//!
//! Commands: `serve`, `migrate`, `probe`, `admin …` (see CONTRACT.md).

use clap::{Parser, Subcommand};
use sluice::accounts::admin as adm;
use sluice::{catalog, config, server, store};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "A model gateway: one base URL for many models."
)]
struct Cli {
    /// Config file (default: conf/sluice.toml if it exists, else built-in defaults).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway, the management API, the web app and the ops endpoints.
    Serve,
    /// Apply pending migrations and exit.
    Migrate,
    /// Probe each platform rung's capabilities once and record them.
    Probe,
    /// Admin operations straight against the configured database.
    #[command(subcommand)]
    Admin(AdminCommand),
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Create an organization; prints {org_id}.
    CreateOrg {
        #[arg(long)]
        name: String,
        #[arg(long)]
        email: Option<String>,
        /// Default: verified unless --email is given; `--email-verified` alone is true.
        #[arg(long, num_args = 0..=1, default_missing_value = "true")]
        email_verified: Option<bool>,
        /// Card on file and the 1 USD verification settled.
        #[arg(long)]
        card_verified: bool,
        #[arg(long, default_value_t = 0.0)]
        credits_usd: f64,
        #[arg(long, default_value_t = 0)]
        tier: i64,
    },
    /// Show an organization.
    ShowOrg { org_id: String },
    /// Create an API key; prints {api_key_id, api_key} (the plaintext, once).
    CreateKey {
        org_id: String,
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        daily_spend_cap_usd: Option<f64>,
        #[arg(long)]
        rpm: Option<i64>,
        #[arg(long)]
        tpm: Option<i64>,
        /// RFC 3339, e.g. 2027-01-01T00:00:00Z.
        #[arg(long)]
        expires_at: Option<String>,
    },
    /// Revoke an API key.
    RevokeKey { api_key_id: String },
    /// Add credits to an organization.
    Credits {
        org_id: String,
        #[arg(long)]
        amount_usd: f64,
        /// grant (default) or purchase.
        #[arg(long)]
        kind: Option<String>,
    },
    /// Record verification steps.
    Verification {
        org_id: String,
        #[arg(long)]
        email: Option<bool>,
        #[arg(long)]
        card_on_file: Option<bool>,
        #[arg(long)]
        settled: Option<bool>,
    },
    /// Replace the restricted slugs the organization may call.
    Grants { org_id: String, slugs: Vec<String> },
    /// Put an organization under review, or release it.
    Review {
        org_id: String,
        #[arg(long)]
        under_review: bool,
        #[arg(long)]
        reason: Option<String>,
        /// A payment-reason review, lifted by a settled payment.
        #[arg(long)]
        for_payment: Option<bool>,
    },
    /// Set an organization's tier.
    Tier { org_id: String, tier: i64 },
    /// Add a member who can sign in to the web app (by mailed link); prints {user_id}.
    AddMember {
        org_id: String,
        #[arg(long)]
        email: String,
    },
    /// Change an organization's settings; prints them as they apply now.
    Settings {
        org_id: String,
        #[arg(long)]
        prompt_capture: Option<bool>,
        #[arg(long)]
        require_zdr: Option<bool>,
        #[arg(long)]
        credits_overflow: Option<bool>,
    },
}

/// jemalloc: about 160 allocations per request cost 11% fewer instructions than
/// glibc's malloc, at the same RSS (docs/decisions.md, Serving).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main`. Pingora's HTTP/1 body reader takes a
/// 64 KiB buffer for a request body larger than what came with its header; above
/// the default 32 KiB thread-cache limit each one went through the arena's extent
/// allocator and back. Cached per thread it costs what a small allocation does.
/// The cache's garbage collection runs after every `tcache_gc_incr_bytes`
/// allocated: at the default 64 KiB one such buffer set it off; at 4 MiB it runs
/// about every 60.
#[export_name = "_rjem_malloc_conf"]
#[allow(non_upper_case_globals)]
static malloc_conf: Option<&'static std::ffi::c_char> =
    // SAFETY: the pointer is to the first byte of a 'static C string literal.
    Some(unsafe { &*c"tcache_max:131072,tcache_gc_incr_bytes:4194304".as_ptr() });

fn main() {
    let cli = Cli::parse();
    init_logs(cli.config.as_deref());
    if let Err(e) = run(cli) {
        eprintln!("sluice: {e:#}");
        std::process::exit(1);
    }
}

/// Logs go to stderr, as text or as JSON lines (`[observability] log_format`).
/// The format is read from the config before anything logs, with logging off
/// meanwhile, so that the real load's warnings come out in it.
fn init_logs(path: Option<&std::path::Path>) {
    let json =
        tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
            config::Config::load(path).is_ok_and(|c| c.observability.log_format == "json")
        });
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    if json {
        logs.json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init();
    } else {
        logs.init();
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let config = config::Config::load(cli.config.as_deref())?;
    match cli.command {
        Command::Serve => server::serve(config),
        Command::Migrate => block_on(async {
            let db = store::Db::connect(&config.storage.database_url).await?;
            db.migrate().await?;
            println!("migrations applied");
            Ok(())
        }),
        Command::Probe => block_on(probe(config)),
        Command::Admin(cmd) => block_on(admin(config, cmd)),
    }
}

fn block_on<F: std::future::Future<Output = anyhow::Result<()>>>(f: F) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

/// Probes each platform rung's capabilities once, records the verdicts (every
/// instance serves them within a second) and prints them.
async fn probe(config: config::Config) -> anyhow::Result<()> {
    let specs = catalog::load_configured(&config.catalog.path)?.unwrap_or_default();
    let db = store::Db::connect(&config.storage.database_url).await?;
    db.migrate().await?;
    let verdicts = sluice::upstream::prober::probe_all(&config, &specs).await;
    catalog::probe::record(&db, &verdicts).await?;
    for m in &specs {
        for r in &m.rungs {
            let found: Vec<String> = verdicts
                .iter()
                .filter(|v| {
                    v.provider == r.provider
                        && v.provider_model_id == r.provider_model_id
                        && v.base_url == r.base_url
                })
                .map(|v| {
                    format!(
                        "{}={}",
                        v.capability,
                        if v.supported { "yes" } else { "no" }
                    )
                })
                .collect();
            let probed = if found.is_empty() {
                "not probed (unreachable or no credential)".to_string()
            } else {
                found.join(",")
            };
            println!(
                "{}\t{}\tdeclared={}\tprobed={}",
                m.slug,
                r.id(),
                r.caps.join(","),
                probed
            );
        }
    }
    Ok(())
}

async fn admin(config: config::Config, cmd: AdminCommand) -> anyhow::Result<()> {
    let db = store::Db::connect(&config.storage.database_url).await?;
    db.migrate().await?;
    let out = match cmd {
        AdminCommand::CreateOrg {
            name,
            email,
            email_verified,
            card_verified,
            credits_usd,
            tier,
        } => {
            adm::create_org(
                &db,
                None,
                adm::CreateOrg {
                    name,
                    email,
                    email_verified,
                    card_verified,
                    credits_usd,
                    tier,
                },
            )
            .await
        }
        AdminCommand::ShowOrg { org_id } => adm::show_org(&db, &org_id).await,
        AdminCommand::CreateKey {
            org_id,
            name,
            daily_spend_cap_usd,
            rpm,
            tpm,
            expires_at,
        } => {
            adm::create_key(
                &db,
                None,
                &org_id,
                adm::CreateKey {
                    name,
                    daily_spend_cap_usd,
                    rpm,
                    tpm,
                    expires_at: expires_at.map(serde_json::Value::from),
                },
            )
            .await
        }
        AdminCommand::RevokeKey { api_key_id } => adm::revoke_key(&db, None, &api_key_id)
            .await
            .map(|()| serde_json::json!({"revoked": api_key_id})),
        AdminCommand::Credits {
            org_id,
            amount_usd,
            kind,
        } => {
            let c = adm::Credits { amount_usd, kind };
            let up = config.billing.tier_up_purchase_usd;
            adm::credits(&db, None, &org_id, c, up).await
        }
        AdminCommand::Verification {
            org_id,
            email,
            card_on_file,
            settled,
        } => {
            adm::verification(
                &db,
                None,
                &org_id,
                adm::Verification {
                    email,
                    card_on_file,
                    settled,
                },
            )
            .await
        }
        AdminCommand::Grants { org_id, slugs } => {
            adm::grants(&db, None, &org_id, adm::Grants { slugs }).await
        }
        AdminCommand::Review {
            org_id,
            under_review,
            reason,
            for_payment,
        } => {
            adm::review(
                &db,
                None,
                &org_id,
                adm::Review {
                    under_review,
                    reason,
                    for_payment,
                },
            )
            .await
        }
        AdminCommand::Tier { org_id, tier } => {
            adm::tier(&db, None, &org_id, adm::Tier { tier }).await
        }
        AdminCommand::AddMember { org_id, email } => {
            adm::add_member(&db, &org_id, adm::AddMember { email }).await
        }
        AdminCommand::Settings {
            org_id,
            prompt_capture,
            require_zdr,
            credits_overflow,
        } => {
            let change = sluice::accounts::orgs::SettingsChange {
                prompt_capture,
                require_zdr,
                credits_overflow,
            };
            let default = config.responses.prompt_capture_default;
            adm::settings(&db, None, &org_id, change, default).await
        }
    };
    match out {
        Ok(v) => {
            println!("{v}");
            Ok(())
        }
        Err(e) => {
            eprintln!(
                "{}",
                String::from_utf8_lossy(&e.to_body(sluice_filters::Format::OpenAi))
            );
            std::process::exit(1);
        }
    }
}
