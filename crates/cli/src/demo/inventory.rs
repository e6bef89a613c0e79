//! Scenario 1, inventory: three pods sell the last units of one product.
//!
//! 1. Without a lock each pod reads the stock, "processes the order" and then decrements: pods
//!    that read the same stock all sell, and the shop sells more than it has (the seed's
//!    "two customers order the last item on two pods").
//! 2. With a leasehold lock per product around read-process-write, exactly the stock is sold.
//! 3. A lock alone is not enough when a holder stalls past its lease: pod A locks with a 1 s
//!    lease, reads the last unit and freezes (SIGSTOP, standing in for a GC pause or a VM
//!    migration); pod B gets the lock when A's lease ends and sells the unit; A wakes up and
//!    sells it again. The fenced UPDATE (`... AND last_fence < :fence`) refuses A's write.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use leasehold::{FencingToken, LockClient};

use super::events::{now_us, PodEvent};
use super::starting_line::StartingLine;
use super::store::{Store, StoreSpec};
use super::{expect, say, start_three_pods, Ctx, STEP_TIMEOUT};

/// The product on sale.
const PRODUCT: i64 = 42;
/// Units left when the pods start.
const UNITS: i64 = 5;
/// One lock per product: orders for other products never wait on this one.
const LOCK: &str = "inventory:42";
/// Pod A's explicit lease in the fencing case.
const STALE_LEASE_MS: u64 = 1_000;

/// Plays the scenario.
pub fn run(ctx: &Ctx) -> anyhow::Result<()> {
    println!("1. Inventory: 3 pods sell the last {UNITS} units of product {PRODUCT}");
    ctx.say_where(LOCK);

    let (sold, stock) = sell_out(ctx, false)?;
    let total: u64 = sold.iter().map(|(_, n)| n).sum();
    let oversold = total as i64 - UNITS;
    if oversold > 0 {
        say(&format!(
            "without a lock: sold {total} ({}), stock now {stock}: oversold by {oversold}",
            per_pod(&sold)
        ));
    } else {
        // Not a failure of the demo: the race is real but timing-dependent.
        say(&format!(
            "without a lock: sold {total} ({}), stock now {stock}: no oversell this time (the race depends on timing)",
            per_pod(&sold)
        ));
    }

    let (sold, stock) = sell_out(ctx, true)?;
    let total: u64 = sold.iter().map(|(_, n)| n).sum();
    say(&format!(
        "with leasehold: sold {total} ({}), stock now {stock}: {}",
        per_pod(&sold),
        if total as i64 == UNITS && stock == 0 {
            "no oversell"
        } else {
            "WRONG"
        }
    ));
    ensure!(
        total as i64 == UNITS && stock == 0,
        "with the lock the pods sold {total} units and left {stock}; expected {UNITS} and 0"
    );

    say("with leasehold, when a holder stalls past its lease (the last unit):");
    fencing(ctx)?;
    say("ok: no oversell with the lock, and the stale write was refused");
    Ok(())
}

/// Three shop pods sell until sold out: `(per-pod sales, final stock)`.
fn sell_out(ctx: &Ctx, locked: bool) -> anyhow::Result<(Vec<(String, u64)>, i64)> {
    ctx.block_on(ctx.store.reset(PRODUCT, UNITS))?;
    let deadline = Instant::now() + STEP_TIMEOUT;
    let mut pods = ctx.pods();
    let mut role = vec!["shop".to_string()];
    role.extend(ctx.spec.pod_args());
    if locked {
        role.push("--locked".into());
    }
    let labels = start_three_pods(&mut pods, &role, deadline, "the shop pods to get ready")?;
    let mut sold = Vec::new();
    for _ in labels {
        let (label, units) = expect(
            &mut pods,
            None,
            deadline,
            "the pods to sell out",
            |e| match e {
                PodEvent::Sold { units } => Some(*units),
                _ => None,
            },
        )?;
        sold.push((label, units));
    }
    pods.finish(deadline)?;
    sold.sort();
    let (stock, _) = ctx.block_on(ctx.store.snapshot(PRODUCT))?;
    Ok((sold, stock))
}

fn per_pod(sold: &[(String, u64)]) -> String {
    sold.iter()
        .map(|(label, n)| format!("{label} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Case 3: a stale holder's write is refused by the fencing token.
fn fencing(ctx: &Ctx) -> anyhow::Result<()> {
    ctx.block_on(ctx.store.reset(PRODUCT, 1))?;
    let deadline = Instant::now() + STEP_TIMEOUT;
    let mut pods = ctx.pods();
    let mut role = vec!["stale-writer".to_string()];
    role.extend(ctx.spec.pod_args());
    role.extend(["--hold-ms".to_string(), STALE_LEASE_MS.to_string()]);
    pods.spawn("pod-A", super::DEFAULT_LEASE_MS, &role)?;
    let (_, (token_a, locked_a_us)) = expect(
        &mut pods,
        Some("pod-A"),
        deadline,
        "pod-A to lock",
        |e| match e {
            PodEvent::Locked { fence, at_us } => Some((*fence, *at_us)),
            _ => None,
        },
    )?;
    let (_, stock_a) = expect(
        &mut pods,
        Some("pod-A"),
        deadline,
        "pod-A to read",
        |e| match e {
            PodEvent::Read { stock } => Some(*stock),
            _ => None,
        },
    )?;
    pods.wait_until_stopped("pod-A", deadline)?;
    say(&format!(
        "  pod-A locked {LOCK} (token {token_a}, lease 1 s), read stock {stock_a}, then froze (SIGSTOP, like a long GC pause)"
    ));

    let mut role = vec!["fresh-writer".to_string()];
    role.extend(ctx.spec.pod_args());
    pods.spawn("pod-B", super::DEFAULT_LEASE_MS, &role)?;
    let (_, (token_b, locked_b_us)) = expect(
        &mut pods,
        Some("pod-B"),
        deadline,
        "pod-B to lock",
        |e| match e {
            PodEvent::Locked { fence, at_us } => Some((*fence, *at_us)),
            _ => None,
        },
    )?;
    let (_, stock_b) = expect(
        &mut pods,
        Some("pod-B"),
        deadline,
        "pod-B to read",
        |e| match e {
            PodEvent::Read { stock } => Some(*stock),
            _ => None,
        },
    )?;
    let (_, rows_b) = expect(
        &mut pods,
        Some("pod-B"),
        deadline,
        "pod-B to write",
        |e| match e {
            PodEvent::Wrote { rows } => Some(*rows),
            _ => None,
        },
    )?;
    say("  pod-A's lease ran out while it was frozen");
    say(&format!(
        "  pod-B locked {:.1} s after pod-A (token {token_b}), read stock {stock_b} and sold it: {rows_b} row updated",
        locked_b_us.saturating_sub(locked_a_us) as f64 / 1e6
    ));

    pods.resume("pod-A")?;
    let (_, rows_a) = expect(
        &mut pods,
        Some("pod-A"),
        deadline,
        "pod-A to write",
        |e| match e {
            PodEvent::Wrote { rows } => Some(*rows),
            _ => None,
        },
    )?;
    say(&format!(
        "  pod-A woke up (SIGCONT) and sold the unit it had read, with its old token: {rows_a} rows updated"
    ));
    pods.finish(deadline)?;
    let (stock, last_fence) = ctx.block_on(ctx.store.snapshot(PRODUCT))?;

    ensure!(
        token_a < token_b,
        "pod-B's token {token_b} is not above pod-A's {token_a}"
    );
    ensure!(
        rows_b == 1,
        "pod-B's fenced write updated {rows_b} rows, expected 1"
    );
    if rows_a != 0 {
        bail!("pod-A's stale write went through ({rows_a} rows): stock is now {stock}");
    }
    say(&format!(
        "  stale write rejected by fencing token (A's token {token_a} < B's token {token_b})"
    ));
    ensure!(
        stock == 0 && last_fence == i64::from(FencingToken::new(token_b)),
        "the store holds stock {stock}, last_fence {last_fence}; expected 0 and {token_b}"
    );
    Ok(())
}

/// Pod role `shop`: sells until the product is sold out, then reports its sales.
pub async fn shop(
    client: &LockClient,
    spec: &StoreSpec,
    locked: bool,
    work: Duration,
    start: &StartingLine,
) -> anyhow::Result<()> {
    let store = Store::open(spec).await?;
    let lock = client.lock(LOCK)?;
    start.ready_and_wait().await;
    let mut units = 0;
    loop {
        if locked {
            let guard = lock.lock().await?;
            let stock = store.stock(PRODUCT).await?;
            if stock <= 0 {
                guard.unlock().await?;
                break;
            }
            tokio::time::sleep(work).await; // processing the order: payment, shipping label
                                            // Fenced even under the lock: should this hold have outlived its lease, a newer
                                            // holder's sale makes this write a no-op instead of a second sale.
            if store.fenced_sell(PRODUCT, guard.fencing_token()).await? == 1 {
                units += 1;
            }
            guard.unlock().await?;
        } else {
            let stock = store.stock(PRODUCT).await?;
            if stock <= 0 {
                break;
            }
            tokio::time::sleep(work).await;
            units += store.sell(PRODUCT).await?;
        }
    }
    PodEvent::Sold { units }.emit();
    Ok(())
}

/// Pod role `stale-writer` (pod A): lock with an explicit lease, read, freeze, write fenced.
pub async fn stale_writer(
    client: &LockClient,
    spec: &StoreSpec,
    lease: Duration,
) -> anyhow::Result<()> {
    let store = Store::open(spec).await?;
    // An explicit lease: no watchdog, the hold ends exactly at the lease, frozen or not.
    let lock = client.lock(LOCK)?;
    let guard = lock.lock_with_lease(lease).await?;
    let token = guard.fencing_token();
    PodEvent::Locked {
        fence: token.get(),
        at_us: now_us(),
    }
    .emit();
    let stock = store.stock(PRODUCT).await?;
    PodEvent::Read { stock }.emit();
    // The whole process stops here until the demo sends SIGCONT, exactly as a stop-the-world
    // pause would stop it: nothing in this process runs, no timer fires, no check is made.
    nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP)?;
    let rows = store.fenced_sell(PRODUCT, token).await?;
    PodEvent::Wrote { rows }.emit();
    let called_at_us = now_us();
    let held = match guard.unlock().await {
        Ok(()) => true,
        Err(leasehold::LockError::NotHeld { .. }) => false,
        Err(error) => return Err(error.into()),
    };
    PodEvent::Unlocked {
        called_at_us,
        returned_at_us: now_us(),
        held,
    }
    .emit();
    Ok(())
}

/// Pod role `fresh-writer` (pod B): wait for the lock, read, sell one unit fenced.
pub async fn fresh_writer(client: &LockClient, spec: &StoreSpec) -> anyhow::Result<()> {
    let store = Store::open(spec).await?;
    let lock = client.lock(LOCK)?;
    let guard = lock.lock().await?;
    PodEvent::Locked {
        fence: guard.fencing_token().get(),
        at_us: now_us(),
    }
    .emit();
    let stock = store.stock(PRODUCT).await?;
    PodEvent::Read { stock }.emit();
    if stock <= 0 {
        bail!("pod-B found no stock to sell");
    }
    let rows = store.fenced_sell(PRODUCT, guard.fencing_token()).await?;
    PodEvent::Wrote { rows }.emit();
    guard.unlock().await?;
    Ok(())
}
