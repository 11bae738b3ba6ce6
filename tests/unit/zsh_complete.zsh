# What zsh offers at the end of each line given (a TAB typed there), the completion
# functions found through the fpath directory $1: one interactive zsh in a pseudo-terminal
# (zsh/zpty), compadd wrapped to print each match after \x01; \x02 ends a line's matches.
# Usage: zsh -f zsh_complete.zsh FPATH_DIR LINE... ; prints the matches, "--" after each line.
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "PS1= ; fpath=($1 \$fpath); autoload -U compinit; compinit -u -D"
zpty -w z 'compprefuncs=(_cap_start); _cap_start() { comppostfuncs=(_cap_end) }'
zpty -w z '_cap_end() { compprefuncs=(_cap_start); compstate[insert]=""; compstate[list]=""; print -r -- $'"'"'\x02'"'"' }'
zpty -w z 'compadd() { local -a __hits; builtin compadd -O __hits "$@"; builtin compadd "$@"; local h; for h in $__hits; do print -r -- $'"'"'\x01'"'"'$h; done }'
zpty -w z "bindkey '^I' complete-word"
shift
for typed in "$@"; do
  zpty -n -w z "$typed"$'\t'
  while zpty -r z line; do
    [[ $line == *$'\x02'* ]] && break
    [[ $line == *$'\x01'* ]] && print -r -- ${${line##*$'\x01'}%%[$'\r\n']*}
  done
  print -r -- --
  zpty -n -w z $'\x15'  # ^U: clear the line for the next one
done
zpty -d z
