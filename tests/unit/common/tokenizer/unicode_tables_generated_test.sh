#!/usr/bin/env bash
# The committed common/tokenizer/unicode_tables*.cc are exactly what gen_unicode_tables.py
# writes now: it is run into a temporary folder and every file compared (none missing, none
# extra). The tables come from Python's unicodedata 14.0.0 (Debian 12's /usr/bin/python3); with
# another version this test fails and says so rather than passing or comparing other data.
# Usage: unicode_tables_generated_test.sh [build_dir] (run from the repository root by ctest).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
python=/usr/bin/python3
expected_version=14.0.0
dir=common/tokenizer

if [ ! -x "$python" ]; then
  echo "FAIL: $python not found; the tables are generated with Debian 12's /usr/bin/python3"
  exit 1
fi
version=$("$python" -c 'import unicodedata; print(unicodedata.unidata_version)')
if [ "$version" != "$expected_version" ]; then
  echo "FAIL: $python has unicodedata $version, the committed tables are from $expected_version;"
  echo "      run this test with Debian 12's /usr/bin/python3 (unicodedata $expected_version)"
  exit 1
fi
if ! grep -q "kUnicodeVersion\[\] = \"$expected_version\"" "$dir/unicode_tables.cc"; then
  echo "FAIL: $dir/unicode_tables.cc does not say kUnicodeVersion = \"$expected_version\""
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/out"
"$python" "$dir/gen_unicode_tables.py" "$tmp/out"

generated=$(cd "$tmp/out" && ls)
committed=$(cd "$dir" && ls unicode_tables*.cc)
if [ -z "$generated" ] || [ "$generated" != "$committed" ]; then
  echo "FAIL: the generator writes [$(echo $generated)] but $dir has [$(echo $committed)]"
  exit 1
fi
status=0
for f in $generated; do
  if ! diff -u "$dir/$f" "$tmp/out/$f" >"$tmp/diff" 2>&1; then
    echo "FAIL: $dir/$f differs from the generator's output:"
    head -40 "$tmp/diff"
    status=1
  fi
done
if [ "$status" -ne 0 ]; then
  echo "Regenerate: $python $dir/gen_unicode_tables.py"
  exit 1
fi
echo "PASS: $(echo $generated) equal gen_unicode_tables.py's output (unicodedata $version)"
