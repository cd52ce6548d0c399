"""A run's verdicts: which (client, target) pairs ended off the source's truth, which
targets the models disagree on, and the list of checks `report.json` and `report.md` show
(each a name, ok, and a detail), the exit status's reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from harness.compare.environment import DEFAULT_PROFILE
from harness.compare.run import Run
from harness.compare.scenario import XDS_MODELS
from harness.normalize import digest


def divergences(run: Run) -> list[dict[str, Any]]:
    """Every (client, target) whose final state is not the source's truth."""
    out: list[dict[str, Any]] = []
    states = run.results.get("states", {})
    for f in run.results.get("finals", []):
        client = f"{f['model']}-{f['index']}"
        for target, st in sorted(f["targets"].items()):
            truth = run.truth.final.get(target)
            if truth is None:
                continue
            problem = ""
            if st.get("status"):
                problem = f"stream ended: {st['status']}"
            elif st["addr"] != digest(truth):
                have = {(row[0], row[1]) for row in states.get(st["full"], [])}
                want = {(e.address, e.port) for e in truth}
                missing = sorted(want - have)
                extra = sorted(have - want)
                problem = (f"holds {len(have)} endpoints, truth has {len(want)}; missing "
                           f"{_addrs(missing)}; unexpected {_addrs(extra)}")
            if problem:
                out.append({"model": f["model"], "client": client, "target": target,
                            "detail": problem})
    return out


def _addrs(items: Sequence[tuple[str, int]], limit: int = 5) -> str:
    shown = ", ".join(f"{a}:{p}" for a, p in items[:limit])
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return (shown or "none") + more


def field_groups(models: Sequence[str], profile: str) -> list[set[str]]:
    """Which models must agree field for field. Every model carries the addresses; the
    rest (identity, protocol hint, opaque transport, zone) reaches an xDS client only
    in meshbridge's own endpoint metadata, the `linkerd` profile: under another one
    the xDS models agree among themselves, and with Linkerd by address (the truth)."""
    if profile == DEFAULT_PROFILE:
        return [set(models)]
    return [g for g in ({m for m in models if m not in XDS_MODELS},
                        {m for m in models if m in XDS_MODELS}) if g]


def disagreements(run: Run, profile: str = DEFAULT_PROFILE) -> list[str]:
    """Targets whose clients of different models hold different full states: both
    protocols must carry the same View, field for field (as normalised), as far as
    the metadata profile lets them (`field_groups`)."""
    out = []
    finals = run.results.get("finals", [])
    for group in field_groups(sorted({f["model"] for f in finals}), profile):
        out += _disagreements(run, [f for f in finals if f["model"] in group])
    return out


def _disagreements(run: Run, finals: Sequence[Mapping[str, Any]]) -> list[str]:
    by_target: dict[str, dict[str, set[str]]] = {}
    for f in finals:
        for target, st in f["targets"].items():
            by_target.setdefault(target, {}).setdefault(f["model"], set()).add(st["full"])
    states = run.results.get("states", {})
    out = []
    for target, per_model in sorted(by_target.items()):
        fulls = {d for ds in per_model.values() for d in ds}
        if len(fulls) > 1:
            rows = {m: sorted(ds) for m, ds in per_model.items()}
            sample = {m: states.get(ds[0], [])[:1] for m, ds in rows.items()}
            out.append(f"{target}: {json.dumps(sample)}")
    return out


def _check(name: str, ok: bool, detail: str = "") -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail}


def checks(fig: Mapping[str, Any], run: Run) -> list[dict[str, Any]]:
    out = []
    models = fig["models"]
    fails = fig["failures"]
    out.append(_check("every client's final state equals the source's truth", not fails,
                      f"{len(fails)} divergent (client, target) pairs" if fails else
                      f"{sum(m['subscriptions'] for m in models.values())} (client, target) "
                      "pairs checked"))
    profile = str(fig.get("environment", {}).get("xds_endpoint_metadata", DEFAULT_PROFILE))
    dis = disagreements(run, profile)
    groups = field_groups(list(models), profile)
    out.append(_check("clients of every model hold the same endpoints, field for field"
                      if len(groups) <= 1 else
                      "clients hold the same endpoints, field for field within "
                      + " and ".join("/".join(sorted(g)) for g in groups)
                      + f" (the {profile} metadata profile), by address across",
                      not dis, "; ".join(dis[:3])))
    out.append(_check("the clients went quiet before the settle deadline",
                      fig["run"]["settled"]))
    broken = fig["run"].get("broken_layers", {})
    out.append(_check("every protocol layer started", not broken,
                      "; ".join(f"{k}: {v}" for k, v in broken.items())))
    env = fig.get("envoy")
    if env is not None:
        bad = [p["name"] for p in env["proxies"] if not p["matches"]]
        rejected = sum(p["update_rejected"] + p["cds_update_rejected"] for p in env["proxies"])
        out.append(_check("every Envoy ends on the source's truth for every service", not bad,
                          f"{', '.join(bad)} differ" if bad else
                          f"{len(env['proxies'])} Envoys x {env['targets']} services"))
        out.append(_check("no Envoy rejected an update", rejected == 0,
                          f"{rejected} rejected"))
    for name, m in models.items():
        if name == "envoy":
            continue
        c, s = m["bytes"]["total"], m["server"]["bytes"]
        out.append(_check(f"{name}: bytes counted by the clients equal bytes sent by the "
                          "server", c == s, f"clients {c}, server {s}"))
        cm, sm = m["messages"]["total"], m["server"]["messages"]
        out.append(_check(f"{name}: messages received equal messages sent", cm == sm,
                          f"clients {cm}, server {sm}"))
        want_streams = m["subscriptions"] if name == "linkerd" else m["clients"]
        out.append(_check(f"{name}: streams held as the model says", m["streams"] ==
                          want_streams, f"{m['streams']} streams, expected {want_streams}"))
        out.append(_check(f"{name}: one connection per client",
                          m["connections"] == m["clients"],
                          f"{m['connections']} connections for {m['clients']} clients"))
        v = m["versions"]
        accounted = v["delivered"] + v["superseded"] + v["unchanged"] + v["missing"]
        out.append(_check(f"{name}: every version of every followed target reached each "
                          "client or was superseded",
                          v["missing"] == 0 and accounted == v["due"],
                          f"due {v['due']}: delivered {v['delivered']}, superseded "
                          f"{v['superseded']}, unchanged {v['unchanged']}, missing "
                          f"{v['missing']}"))
        churn_updates = m["messages"]["target_updates"] - m["subscriptions"]
        if name == "leds":
            continue  # a change may take a CLA and LbEndpoint responses: no fixed count
        if name in ("sotw", "delta"):
            out.append(_check(f"{name}: one resource update per delivered version "
                              "(none redundant, none unexplained)",
                              churn_updates == v["delivered"]
                              and v["intermediate_messages"] == 0,
                              f"{churn_updates} updates during the churn, "
                              f"{v['delivered']} versions delivered, "
                              f"{v['repeated_updates']} repeated, "
                              f"{v['intermediate_messages']} matching no version"))
        else:
            lo, hi = v["delivered"], 2 * (v["delivered"] + v["superseded"]) + v["unchanged"]
            out.append(_check(f"{name}: messages match the churn (one or two Updates, add "
                              "and remove, per delivered version)",
                              lo <= m["messages"]["churn"] <= hi,
                              f"{m['messages']['churn']} messages for {v['delivered']} "
                              f"versions delivered"))
    return out
