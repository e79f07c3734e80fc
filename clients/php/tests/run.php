<?php
// The PHP client's tests. First installs the package as users do: composer install of a
// scratch copy of example/ (the package from this checkout as a path repository), then
// runs every test against that installed copy: the conformance table, a real daemon, and
// the example application behind `php -S`. Prints "php: N passed, M failed" last.
//   php tests/run.php     (RATELIMITD_BIN: the daemon; RL_TEST_ROOT: where temp dirs go)
//
// CI has no Packagist: the scratch project gets Debian's PSR-7/PSR-17 interfaces and
// nyholm/psr7 (declared "provide"d, loaded by Debian's autoloaders) and PSR-15's two
// interfaces from tests/fixtures (Debian 12 does not package them).

declare(strict_types=1);

require __DIR__ . '/harness.php';

$root = getenv('RL_TEST_ROOT') ?: sys_get_temp_dir();
$app = $root . '/rl-php-app-' . bin2hex(random_bytes(4));

test('composer install from a path repository', function () use ($app) {
    $lib = dirname(__DIR__);
    exec('cp -r ' . escapeshellarg("$lib/example") . ' ' . escapeshellarg($app), $out, $rc);
    check($rc === 0, 'copy example/');
    $j = json_decode((string) file_get_contents("$app/composer.json"), true);
    $j['repositories'] = [
        ['type' => 'path', 'url' => $lib, 'options' => ['symlink' => false]],
        ['type' => 'path', 'url' => "$lib/tests/fixtures/psr-http-server-handler"],
        ['type' => 'path', 'url' => "$lib/tests/fixtures/psr-http-server-middleware"],
        ['packagist.org' => false],
    ];
    $j['provide'] = ['psr/http-message' => '1.0.1', 'psr/http-factory' => '1.0.1', 'nyholm/psr7' => '1.5.1'];
    $j['autoload'] = ['files' => ['/usr/share/php/Nyholm/Psr7/autoload.php']];
    file_put_contents("$app/composer.json", json_encode($j, JSON_PRETTY_PRINT | JSON_UNESCAPED_SLASHES));
    $cmd = 'cd ' . escapeshellarg($app) . ' && COMPOSER_HOME=' . escapeshellarg("$app/.composer")
        . ' COMPOSER_DISABLE_NETWORK=1 composer install --no-interaction --no-progress 2>&1';
    exec($cmd, $out, $rc);
    echo '    ' . implode("\n    ", array_filter($out, fn ($l) => str_contains($l, 'Installing') || str_contains($l, 'rror'))) . "\n";
    check($rc === 0, "composer install: rc $rc\n" . implode("\n", $out));
    check(is_file("$app/vendor/ratelimitd/client/src/Client.php"), 'the package is in vendor/');
});
run_pending();

if (is_file("$app/vendor/autoload.php")) {
    require "$app/vendor/autoload.php";
} else {
    // Without composer the tests still run, on the checkout (the install test failed).
    require '/usr/share/php/Nyholm/Psr7/autoload.php';
    require __DIR__ . '/fixtures/psr-http-server-handler/src/RequestHandlerInterface.php';
    require __DIR__ . '/fixtures/psr-http-server-middleware/src/MiddlewareInterface.php';
    spl_autoload_register(function (string $class) {
        if (str_starts_with($class, 'RateLimitd\\')) {
            require dirname(__DIR__) . '/src/' . substr($class, 11) . '.php';
        }
    });
}
$reflection = new ReflectionClass(RateLimitd\Client::class);
echo '# testing ' . dirname((string) $reflection->getFileName()) . "\n";

require __DIR__ . '/conformance.php';
require __DIR__ . '/daemon.php';
require __DIR__ . '/slots.php';
require __DIR__ . '/several.php';

run_pending();
exec('rm -rf ' . escapeshellarg($app));
exit(finish());
