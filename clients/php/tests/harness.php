<?php
// A minimal test harness (PHPUnit is not in Debian's php-cli set CI installs): named tests,
// one line per result, a summary line clients/run_tests.sh reads; plus the helpers every
// test file shares (a real daemon through clients/testdaemon.sh, the scripted stand-in).

declare(strict_types=1);

/** @var array<string, Closure> */
$GLOBALS['tests'] = [];

function test(string $name, Closure $f): void
{
    $GLOBALS['tests'][$name] = $f;
}

function check(bool $cond, string $what): void
{
    if (!$cond) {
        throw new RuntimeException("assertion failed: $what");
    }
}

/** Runs the tests registered so far, in order. */
function run_pending(): void
{
    $GLOBALS['pass'] ??= 0;
    $GLOBALS['fail'] ??= 0;
    foreach ($GLOBALS['tests'] as $name => $f) {
        try {
            $f();
            $GLOBALS['pass']++;
            echo "ok - $name\n";
        } catch (Throwable $e) {
            $GLOBALS['fail']++;
            echo "not ok - $name: " . get_class($e) . ': ' . $e->getMessage() . "\n";
        }
    }
    $GLOBALS['tests'] = [];
}

/** Prints the summary; the exit status. */
function finish(): int
{
    echo "php: {$GLOBALS['pass']} passed, {$GLOBALS['fail']} failed\n";
    return $GLOBALS['fail'] === 0 ? 0 : 1;
}

function temp_dir(string $prefix): string
{
    $dir = (getenv('RL_TEST_ROOT') ?: sys_get_temp_dir()) . "/$prefix-" . bin2hex(random_bytes(4));
    mkdir($dir);
    return $dir;
}

/** A real ratelimitd (redis.mode none; rules "api": 5 that barely refill, "fast"). */
final class Daemon
{
    public string $dir;
    public string $socket;

    public function __construct()
    {
        $this->dir = temp_dir('rl-php');
        $this->socket = $this->dir . '/rl.sock';
        $this->run('start');
    }

    public function run(string $cmd): void
    {
        exec('bash ' . escapeshellarg(__DIR__ . '/../../testdaemon.sh') . " $cmd " . escapeshellarg($this->dir) . ' 2>&1', $out, $rc);
        if ($rc !== 0) {
            throw new RuntimeException("testdaemon.sh $cmd: " . implode("\n", $out));
        }
    }

    public function stop(): void
    {
        $this->run('resume');
        $this->run('stop');
        exec('rm -rf ' . escapeshellarg($this->dir));
    }
}

/** The scripted stand-in of tests/standin.php, in its own process. */
final class StandIn
{
    public string $dir;
    public string $socket;
    /** @var resource|null */
    private $proc = null;

    /** @param list<string> $replies */
    public function __construct(string $mode, array $replies)
    {
        $this->dir = temp_dir('rl-php-s');
        $this->socket = $this->dir . '/s.sock';
        if ($mode === 'absent') {
            return;
        }
        $cmd = [PHP_BINARY, __DIR__ . '/standin.php', $this->socket, $mode, json_encode($replies), $this->dir . '/log'];
        // Not STDERR itself: PHP would seek it, and with 2>&1 into a file, stdout with it.
        $this->proc = proc_open($cmd, [0 => ['file', '/dev/null', 'r'], 1 => ['file', '/dev/null', 'w'], 2 => ['file', $this->dir . '/err', 'w']], $pipes);
        for ($i = 0; $i < 1000 && !file_exists($this->dir . '/log.ready'); $i++) {
            usleep(5000);
        }
        check(file_exists($this->dir . '/log.ready'), 'stand-in listening: ' . @file_get_contents($this->dir . '/err'));
    }

    /** @return list<string> the request lines it read */
    public function requests(): array
    {
        return array_values(array_map(fn ($l) => substr($l, 4), array_filter($this->log(), fn ($l) => str_starts_with($l, 'REQ '))));
    }

    public function connections(): int
    {
        return count(array_filter($this->log(), fn ($l) => $l === 'CONN'));
    }

    /** @return list<string> */
    private function log(): array
    {
        $f = $this->dir . '/log';
        return is_file($f) ? explode("\n", rtrim((string) file_get_contents($f), "\n")) : [];
    }

    public function stop(): void
    {
        if ($this->proc) {
            proc_terminate($this->proc, 9);
            proc_close($this->proc);
        }
        exec('rm -rf ' . escapeshellarg($this->dir));
    }
}
