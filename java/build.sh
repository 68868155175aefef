#!/usr/bin/env bash
# Builds the raytopics Spark connector jar: build.sh OUT_JAR (PYTHON names the Python
# whose pyspark supplies the Spark, Arrow and Jackson jars compiled against).
set -euo pipefail
out=${1:?usage: java/build.sh OUT_JAR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
main=$here/src/main
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")

if [[ -f $out && -z $(find "$main" -type f -newer "$out" -print -quit) ]]; then
    echo "raytopics connector up to date: $out"
    exit 0
fi

jars=$("${PYTHON:-python3}" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mapfile -t sources < <(find "$main/java" -name '*.java' | sort)
# -path: Spark's jars name absent jars in their manifests' Class-Path, which is not ours to fix.
javac --release 17 -Xlint:all,-path -Werror -encoding UTF-8 \
    -cp "$jars/*" -d "$work/classes" "${sources[@]}"
cp -R "$main/resources/." "$work/classes/"
jar --create --file "$work/connector.jar" -C "$work/classes" .
mv "$work/connector.jar" "$out"
echo "raytopics connector built: $out (${#sources[@]} sources)"
