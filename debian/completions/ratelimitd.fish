# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_ratelimitd_global_optspecs
    string join \n c/config= check print-man print-completions= h/help V/version
end

function __fish_ratelimitd_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_ratelimitd_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_ratelimitd_using_subcommand
    set -l cmd (__fish_ratelimitd_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c ratelimitd -n "__fish_ratelimitd_needs_command" -s c -l config -d 'Configuration file (TOML), see ratelimitd.toml(5)' -r -F
complete -c ratelimitd -n "__fish_ratelimitd_needs_command" -l print-completions -d 'Print the completion script for SHELL and exit' -r -f -a "bash\t''
elvish\t''
fish\t''
powershell\t''
zsh\t''"
complete -c ratelimitd -n "__fish_ratelimitd_needs_command" -l check -d 'Validate the configuration, print a summary and exit (0 valid, 2 invalid)'
complete -c ratelimitd -n "__fish_ratelimitd_needs_command" -l print-man -d 'Print the manual page ratelimitd(8) (roff) and exit'
complete -c ratelimitd -n "__fish_ratelimitd_needs_command" -s h -l help -d 'Print help'
complete -c ratelimitd -n "__fish_ratelimitd_needs_command" -s V -l version -d 'Print version'
complete -c ratelimitd -n "__fish_ratelimitd_needs_command" -f -a "ctl" -d 'Ask a running daemon: inspect or reset a key, list the rules, the hottest keys (operators only: server.admin_uids / admin_gids)'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and not __fish_seen_subcommand_from inspect reset override rules top" -l socket -d 'The daemon\'s socket (default: server.socket of --config)' -r -F
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and not __fish_seen_subcommand_from inspect reset override rules top" -s c -l config -d 'Configuration whose server.socket to use (default: /etc/ratelimitd/ratelimitd.toml)' -r -F
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and not __fish_seen_subcommand_from inspect reset override rules top" -l json -d 'Print JSON instead of text'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and not __fish_seen_subcommand_from inspect reset override rules top" -s h -l help -d 'Print help'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and not __fish_seen_subcommand_from inspect reset override rules top" -f -a "inspect" -d 'A key\'s state (a CHECK of cost 0, nothing taken), the rule\'s parameters, and what this daemon holds for the key'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and not __fish_seen_subcommand_from inspect reset override rules top" -f -a "reset" -d 'Delete a key\'s state: in Redis, in this daemon\'s deny cache and local buckets'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and not __fish_seen_subcommand_from inspect reset override rules top" -f -a "override" -d 'Give a key other parameters of its rule\'s algorithm at run time, on every daemon (stored in Redis beside the key), or clear them'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and not __fish_seen_subcommand_from inspect reset override rules top" -f -a "rules" -d 'Every rule and its parameters'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and not __fish_seen_subcommand_from inspect reset override rules top" -f -a "top" -d 'This daemon\'s hottest keys of a rule over the last minute'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from inspect" -l socket -d 'The daemon\'s socket (default: server.socket of --config)' -r -F
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from inspect" -s c -l config -d 'Configuration whose server.socket to use (default: /etc/ratelimitd/ratelimitd.toml)' -r -F
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from inspect" -l json -d 'Print JSON instead of text'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from inspect" -s h -l help -d 'Print help'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from reset" -l socket -d 'The daemon\'s socket (default: server.socket of --config)' -r -F
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from reset" -s c -l config -d 'Configuration whose server.socket to use (default: /etc/ratelimitd/ratelimitd.toml)' -r -F
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from reset" -l json -d 'Print JSON instead of text'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from reset" -s h -l help -d 'Print help'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from override" -l socket -d 'The daemon\'s socket (default: server.socket of --config)' -r -F
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from override" -s c -l config -d 'Configuration whose server.socket to use (default: /etc/ratelimitd/ratelimitd.toml)' -r -F
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from override" -l json -d 'Print JSON instead of text'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from override" -s h -l help -d 'Print help'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from rules" -l socket -d 'The daemon\'s socket (default: server.socket of --config)' -r -F
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from rules" -s c -l config -d 'Configuration whose server.socket to use (default: /etc/ratelimitd/ratelimitd.toml)' -r -F
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from rules" -l json -d 'Print JSON instead of text'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from rules" -s h -l help -d 'Print help'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from top" -l socket -d 'The daemon\'s socket (default: server.socket of --config)' -r -F
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from top" -s c -l config -d 'Configuration whose server.socket to use (default: /etc/ratelimitd/ratelimitd.toml)' -r -F
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from top" -l json -d 'Print JSON instead of text'
complete -c ratelimitd -n "__fish_ratelimitd_using_subcommand ctl; and __fish_seen_subcommand_from top" -s h -l help -d 'Print help'
