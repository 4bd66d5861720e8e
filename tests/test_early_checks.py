"""What the front door answers before PyTorch loads: a missing config file or party table, refused in the line the full
run would print, and `lvfl fit --help`, lvfl's own options first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO

from lvfl.commands.early_checks import early_refusal

EXAMPLE = REPO / "examples/bank_retailer/config.yaml"

#: runs the front door on argv[1:] and reports whether torch was ever imported (the check's whole point)
PROBE = """
import sys
from lvfl.commands.entry import main
try:
    main(sys.argv[1:])
except SystemExit as stop:
    print("exit", stop.code, "torch loaded:", "torch" in sys.modules)
"""


def _missing_bank(tmp_path: Path) -> Path:
    config = yaml.safe_load(EXAMPLE.read_text())
    config["data"]["init_args"]["parties"][0]["path"] = "bank_typo.csv"  # relative: to the config's folder
    config["data"]["init_args"]["parties"][1]["path"] = str(EXAMPLE.parent / "retailer.csv")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_a_missing_table_or_config_is_refused_before_torch_loads(tmp_path):
    config = _missing_bank(tmp_path)
    table = f"party table {tmp_path / 'bank_typo.csv'} does not exist (the `path` of a PartyTables entry)"
    for args, line in (
        (["fit", "--config", str(config)], table),
        (["launch", "--config", str(config)], table),
        (["test", "--config", str(tmp_path / "nope.yaml")], f"--config {tmp_path / 'nope.yaml'}: no such file"),
    ):
        done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=REPO, capture_output=True, text=True,
                              check=False, timeout=120)  # fmt: skip
        assert done.stdout.strip() == "exit 2 torch loaded: False", done.stdout + done.stderr
        assert done.stderr.strip() == f"lvfl: error: {line}"


def test_the_early_line_is_the_full_runs_and_what_it_cannot_decide_is_left_to_it(tmp_path):
    config = _missing_bank(tmp_path)
    early = early_refusal(["fit", "--config", str(config)])
    from lvfl.commands.fit import build_cli  # the full run, with no early check in front

    args = ["fit", "--config", str(config), f"--trainer.logger.init_args.save_dir={tmp_path}"]
    with pytest.raises(FileNotFoundError) as refused:
        build_cli(args, exit_on_error=False)
    assert str(refused.value) == early
    party = ["party", "--party", "party1", "--config", str(config)]  # a party holds its own table only
    assert early_refusal(party, check_tables=False) is None
    replaced = ["--data.init_args.parties=[]"]  # the command line replaces the tables: the full run decides
    assert early_refusal(["fit", "--config", str(config), *replaced]) is None
    assert early_refusal(["fit", "--config", str(EXAMPLE)]) is None
    fragment = tmp_path / "fragment.yaml"  # a later config that sets data but no tables: the full run decides
    fragment.write_text("data:\n  init_args:\n    batch_size: 16\n")
    assert early_refusal(["fit", "--config", str(config), "--config", str(fragment)]) is None


@pytest.mark.slow
def test_fit_help_leads_with_lvfls_own_options_and_says_where_the_rest_are():
    """`lvfl fit --help` is a page, not 500 lines led by Trainer flags, printed before PyTorch loads; `--help all` is
    LightningCLI's whole help; `launch --help` and `party --help` print no stray fragment of argparse's usage."""
    done = subprocess.run([sys.executable, "-c", PROBE, "fit", "--help"], cwd=REPO, capture_output=True, text=True,
                          check=False, timeout=120)  # fmt: skip
    page = done.stdout.splitlines()
    assert page[-1] == "exit 0 torch loaded: False"
    assert len(page) < 40
    own = page[: page.index("Lightning's Trainer options, the ones most runs set:")]
    options = [line.split()[0] for line in own if line.startswith("  --")]
    assert options[:4] == ["--config", "--model", "--model.help", "--data"]
    assert "--ckpt_path" in options
    assert "--debug" in options
    assert not any(option.startswith("--trainer.") for option in options)  # named after them, as Lightning's
    assert "Every option, all of Lightning's Trainer flags included: lvfl fit --help all" in page
    whole = subprocess.run([sys.executable, "-m", "lvfl", "fit", "--help", "all"], cwd=REPO, capture_output=True,
                           text=True, check=False, timeout=300)  # fmt: skip
    assert whole.returncode == 0
    assert "--trainer.max_epochs MAX_EPOCHS" in whole.stdout
    for sub in ("launch", "party"):
        shown = subprocess.run([sys.executable, "-m", "lvfl", sub, "--help"], cwd=REPO, capture_output=True,
                               text=True, check=False, timeout=120).stdout.splitlines()  # fmt: skip
        assert shown[0].startswith(f"usage: lvfl {sub} ")
        assert shown[1] == ""
        assert shown[3:5] == ["", "options:"]  # the description, then the options: no usage fragment between
