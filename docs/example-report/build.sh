#!/bin/sh
# Regenerates docs/example-report from the scenario library's replay cassettes (no model server; 10-15 seconds):
# two "models" per scenario, `replay:ideal.jsonl` and `replay:broken.jsonl` (each scenario folder under
# tests/cassettes holds its own pair), at two temperatures, two repetitions each. Replayed replies ignore the
# temperature, so the two temperatures agree here; on a live model they differ.
# Run from the repository root:  sh docs/example-report/build.sh
set -eu
root=$(pwd)
ledger=$(mktemp -d)/example.sqlite
for dir in tests/cassettes/*/; do
    name=$(basename "$dir")
    (cd "$dir" && python -m harness run "$root/scenarios/$name.toml" --model replay:ideal.jsonl --model replay:broken.jsonl \
        --temperature 0 --temperature 0.7 --repeats 2 --ledger "$ledger" > /dev/null)
done
rm -f docs/example-report/*.png docs/example-report/*.md
python -m harness report --ledger "$ledger" --by model,temperature --out docs/example-report
echo "ledger: $ledger"
