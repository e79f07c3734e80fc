<?php
// A scripted stand-in for the daemon (its own process: PHP has no threads), driven by one
// case of clients/conformance.json. Logs "CONN" per accepted connection and "REQ <line>"
// per request line to LOG.
//   php standin.php SOCKET MODE REPLIES_JSON LOG     (MODE: reply | stall | close)

declare(strict_types=1);

[, $socket, $mode, $repliesJson, $log] = $argv;
$replies = json_decode($repliesJson, true);
$server = stream_socket_server('unix://' . $socket, $errno, $errstr);
if (!$server) {
    fwrite(STDERR, "standin: $errstr\n");
    exit(1);
}
touch("$log.ready"); // listening now (the socket file appears at bind, before listen)
$conns = [];   // id => [stream, served, buffer]
while (true) {
    $read = [$server];
    foreach ($conns as $c) {
        $read[] = $c[0];
    }
    $w = $e = null;
    if (@stream_select($read, $w, $e, null) === false) {
        exit(0);
    }
    foreach ($read as $s) {
        if ($s === $server) {
            $c = @stream_socket_accept($server, 0);
            if ($c) {
                file_put_contents($log, "CONN\n", FILE_APPEND);
                $conns[get_resource_id($c)] = [$c, 0, ''];
            }
            continue;
        }
        $id = get_resource_id($s);
        $data = fread($s, 65536);
        if ($data === '' || $data === false) {
            fclose($s);
            unset($conns[$id]);
            continue;
        }
        if ($mode === 'close') {
            fclose($s);
            unset($conns[$id]);
            continue;
        }
        $conns[$id][2] .= $data;
        while (($nl = strpos($conns[$id][2], "\n")) !== false) {
            $line = substr($conns[$id][2], 0, $nl);
            $conns[$id][2] = substr($conns[$id][2], $nl + 1);
            file_put_contents($log, "REQ $line\n", FILE_APPEND);
            if ($mode === 'stall' || $conns[$id][1] >= count($replies)) {
                continue;
            }
            $reply = $replies[$conns[$id][1]++];
            fwrite($s, "$reply\n");
            if (str_starts_with($reply, 'ERR BUSY') || str_starts_with($reply, 'ERR PERM')) {
                fclose($s);
                unset($conns[$id]);
                break;
            }
        }
    }
}
