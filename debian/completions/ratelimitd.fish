complete -c ratelimitd -s c -l config -d 'Configuration file (TOML), see ratelimitd.toml(5)' -r -F
complete -c ratelimitd -l print-completions -d 'Print the completion script for SHELL and exit' -r -f -a "bash\t''
elvish\t''
fish\t''
powershell\t''
zsh\t''"
complete -c ratelimitd -l check -d 'Validate the configuration, print a summary and exit (0 valid, 2 invalid)'
complete -c ratelimitd -l print-man -d 'Print the manual page ratelimitd(8) (roff) and exit'
complete -c ratelimitd -s h -l help -d 'Print help'
complete -c ratelimitd -s V -l version -d 'Print version'
