"""The leaderboard: `dare leaderboard` or `make leaderboard` (Streamlit, 127.0.0.1).

A read-only view over validated result JSONs: committed ones under leaderboard/results/ and any
run folders given with `--runs` (or $DARE_LEADERBOARD_RUNS). Invalid files are listed, never fatal.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
import load  # noqa: E402  (leaderboard/load.py)

st.set_page_config(page_title="dLLM post-training leaderboard", layout="wide")
st.title("dLLM post-training leaderboard")

items, invalid = load.load_all()
if invalid:
    with st.expander(f"⚠ {len(invalid)} invalid result file(s) skipped", expanded=True):
        st.dataframe(pd.DataFrame([{"file": str(p), "reason": why} for p, why in invalid]), hide_index=True)
if not items:
    st.info("No results yet. Run `make demo`, then `make leaderboard`.")
    st.stop()

families = sorted({r.model.family for _, r in items})
family = st.sidebar.selectbox("Model family", families, key="family")
models = sorted({r.model.name for _, r in items if r.model.family == family})
model = st.sidebar.selectbox("Model", models, key="model")
chosen = [(p, r) for p, r in items if r.model.family == family and r.model.name == model]

st.subheader(f"{model} ({family})")
benchmarks, rows = load.table([r for _, r in chosen])
st.caption("Main metric of each benchmark, in %: mean ± std over seeds (sample std).")
st.dataframe(pd.DataFrame(rows), hide_index=True)

st.subheader("Runs")
st.dataframe(pd.DataFrame(load.run_rows(chosen)), hide_index=True)
