#!/usr/bin/env bash
# Compiles the connector and its unit tests (plain main classes named *Test) and runs each;
# exits non-zero if any fails. PYTHON names the Python whose pyspark supplies the jars.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
jars=$("${PYTHON:-python3}" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mapfile -t sources < <(find "$here/src/main/java" "$here/src/test/java" -name '*.java' | sort)
javac --release 17 -Xlint:all,-path -Werror -encoding UTF-8 -cp "$jars/*" -d "$work" "${sources[@]}"
# Arrow reaches into java.nio for buffer addresses; Spark's launcher opens it the same way.
jvm=(java --add-opens=java.base/java.nio=ALL-UNNAMED -cp "$work:$jars/*")
failed=()
while read -r test; do
    name=io.raytopics.spark.$(basename "$test" .java)
    if ! "${jvm[@]}" "$name"; then
        failed+=("$name")
    fi
done < <(find "$here/src/test/java" -name '*Test.java' | sort)
if ((${#failed[@]})); then
    echo "FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "all raytopics connector tests passed"
