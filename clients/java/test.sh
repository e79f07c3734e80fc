#!/usr/bin/env bash
# Builds and tests the Java client as its users do, with Maven and pom.xml (`mvn install`),
# offline against Debian's Maven repository (debian-settings.xml; Maven Central is out of
# reach in CI). Surefire's summary ("Tests run: N, Failures: F, Errors: E, Skipped: S")
# is what clients/run_tests.sh reads. Where Maven is not installed it says so and builds
# the same sources with plain javac against Debian's jars, run by JUnit's console
# launcher ("[ N tests successful ]", "[ M tests failed ]").
#   bash clients/java/test.sh      (RATELIMITD_BIN: the daemon for the real-daemon tests)
# Needs openjdk-17-jdk-headless, libjakarta-servlet-api-java, junit5, and for Maven: maven,
# libmaven-compiler-plugin-java, libmaven-resources-plugin-java, libmaven-jar-plugin-java,
# libmaven-install-plugin-java, libsurefire-java (Debian packages; tests/run.sh installs them).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"
jars=${JAVA_JARS:-/usr/share/java}
out=$(mktemp -d "${TMPDIR:-/tmp}/rl-java-build-XXXXXX")
trap 'rm -rf "$out"' EXIT

if command -v mvn >/dev/null 2>&1 && [ -d /usr/share/maven-repo/org/apache/maven/plugins/maven-surefire-plugin ]; then
  # Debian packages surefire 2.22.3 (pom.xml names 3.0.0 for users); warnings fail the
  # build as with javac -Werror. The jar is installed into a scratch local repository.
  surefire=$(find /usr/share/maven-repo/org/apache/maven/plugins/maven-surefire-plugin -mindepth 1 -maxdepth 1 \
    -name '[0-9]*' -printf '%f\n' | sort -V | tail -n 1)
  echo "java: mvn install ($(mvn -v 2>/dev/null | sed -n '1s/\x1b\[[0-9;]*m//g; 1p'), surefire $surefire, Debian's repository)"
  rc=0
  rm -rf target
  mvn -B --no-transfer-progress -s debian-settings.xml -Dmaven.repo.local="$out/m2" \
    -Dsurefire.version="$surefire" -Dmaven.compiler.failOnWarning=true install || rc=$?
  rm -rf target
  exit "$rc"
fi

echo "java: Maven (or Debian's Maven plugins) not installed: building with javac instead" >&2
servlet=$jars/jakarta-servlet-api.jar
launcher=$jars/junit-platform-console-standalone.jar
for j in "$servlet" "$launcher"; do
  [ -f "$j" ] || { echo "java: $j missing (apt-get install libjakarta-servlet-api-java junit5)" >&2; exit 1; }
done
# The library alone, as users compile it (the servlet API is "provided" by their container).
javac --release 17 -Xlint:all -Werror -d "$out/main" -cp "$servlet" $(find src/main/java -name '*.java')
(cd "$out/main" && jar --create --file "$out/ratelimitd-client.jar" .)
# The tests, against that jar.
javac --release 17 -Xlint:all -Werror -d "$out/test" -cp "$out/ratelimitd-client.jar:$servlet:$launcher" \
  $(find src/test/java -name '*.java')

java -Drl.conformance="$here/../conformance.json" -Drl.testdaemon="$here/../testdaemon.sh" \
  -jar "$launcher" --disable-banner --disable-ansi-colors --details=tree \
  --class-path "$out/ratelimitd-client.jar:$out/test:$servlet" --scan-class-path "$out/test"
