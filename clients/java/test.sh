#!/usr/bin/env bash
# Builds the Java client with plain javac against Debian's jars (Maven Central is out of
# reach in CI; pom.xml is for users) and runs its JUnit 5 tests with the console launcher,
# whose summary ("N tests successful", "M tests failed") clients/run_tests.sh reads.
#   bash clients/java/test.sh      (RATELIMITD_BIN: the daemon for the real-daemon tests)
# Needs: openjdk-17-jdk-headless, libjakarta-servlet-api-java, junit5 (Debian packages).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"
jars=${JAVA_JARS:-/usr/share/java}
servlet=$jars/jakarta-servlet-api.jar
launcher=$jars/junit-platform-console-standalone.jar
for j in "$servlet" "$launcher"; do
  [ -f "$j" ] || { echo "java: $j missing (apt-get install libjakarta-servlet-api-java junit5)" >&2; exit 1; }
done
out=$(mktemp -d "${TMPDIR:-/tmp}/rl-java-build-XXXXXX")
trap 'rm -rf "$out"' EXIT

# The library alone, as users compile it (the servlet API is "provided" by their container).
javac --release 17 -Xlint:all -Werror -d "$out/main" -cp "$servlet" $(find src/main/java -name '*.java')
(cd "$out/main" && jar --create --file "$out/ratelimitd-client.jar" .)
# The tests, against that jar.
javac --release 17 -Xlint:all -Werror -d "$out/test" -cp "$out/ratelimitd-client.jar:$servlet:$launcher" \
  $(find src/test/java -name '*.java')

java -Drl.conformance="$here/../conformance.json" -Drl.testdaemon="$here/../testdaemon.sh" \
  -jar "$launcher" --disable-banner --disable-ansi-colors --details=tree \
  --class-path "$out/ratelimitd-client.jar:$out/test:$servlet" --scan-class-path "$out/test"
