# Doxygen INPUT_FILTER for include/gpumem.h: the status enum is generated
# from GPUMEM_STATUS_MAP(XX) with an X-macro, which Doxygen's preprocessor
# does not expand cleanly. This filter writes the enumerators out, each
# documented with its message, and drops the helper macro lines. Every other
# line (so every line number) is kept. POSIX awk.
#   awk -f doxygen-status-filter.awk include/gpumem.h
function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
/^#define GPUMEM_STATUS_MAP\(XX\)/ { in_map = 1; print; next }
in_map {
  line = $0
  if (match(line, /XX\(/)) {
    rest = substr(line, RSTART + 3)
    c = index(rest, ","); name = trim(substr(rest, 1, c - 1)); rest = substr(rest, c + 1)
    c = index(rest, ","); value = trim(substr(rest, 1, c - 1)); rest = substr(rest, c + 1)
    q1 = index(rest, "\""); msg = substr(rest, q1 + 1)
    sub(/"\)[ \t]*\\?[ \t]*$/, "", msg)
    n++; names[n] = name; values[n] = value; msgs[n] = msg
  }
  if (line !~ /\\[ \t]*$/) in_map = 0
  print
  next
}
/^#define GPUMEM__STATUS_ENUM/ || /^#undef GPUMEM__STATUS_ENUM/ { print ""; next }
/GPUMEM_STATUS_MAP\(GPUMEM__STATUS_ENUM\)/ {
  out = ""
  for (i = 1; i <= n; i++) {
    m = msgs[i]; gsub(/\*\//, "* /", m)
    out = out "GPUMEM_" names[i] " = " values[i] ", /**< " m " */ "
  }
  print out
  next
}
{ print }
