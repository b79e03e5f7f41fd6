# nginx in vmB1 (sendfile), curl in vmA2: files up to 64 MiB. nginx_conf: tests/e2e/lib.sh.

case_nginx() {
  local name=cross_nginx_curl_sha256 rep=$WORK/nginx.jsonl port www=$WORK/www
  port=$(alloc_port)
  mkdir -p "$www"
  local sizes="0 1 4095 65536 1048577 16777216 67108864"
  for s in $sizes; do head -c "$s" /dev/urandom >"$www/f$s"; done
  nginx_conf nginx "$B1" $port "$www"
  vm_bg vmB1 preload "$rep" "$WORK/nginx.srv" nginx -c "$WORK/nginx.conf"
  local srv=$BG b0
  for _ in $(seq 50); do [ -s "$WORK/nginx.pid" ] && break; sleep 0.1; done
  sleep 0.3
  b0=$(counter hostB fabric_bytes_out)
  local bad=""
  for s in $sizes; do
    local got want
    got=$(vm_run vmA2 preload "$rep" curl -sf "http://$B1:$port/f$s" | sha256sum | cut -d' ' -f1)
    want=$(sha256sum "$www/f$s" | cut -d' ' -f1)
    [ "$got" = "$want" ] || bad="$bad f$s"
  done
  kill -QUIT "$(cat "$WORK/nginx.pid" 2>/dev/null)" 2>/dev/null
  sleep 0.5
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  [ -z "$bad" ] || { fail $name "sha256 mismatch for:$bad"; return; }
  local db out
  db=$(($(counter hostB fabric_bytes_out) - b0))
  if ! out=$(python3 $CHECK "$rep" --port $port --bulk-accel 4194304); then
    fail $name "$out"
    return
  fi
  [ "$db" -gt 67108864 ] || { fail $name "only $db B crossed the fabric B->A"; return; }
  pass "$name (files up to 64 MiB via sendfile, sha256 equal; $out; fabric B->A $db B)"
}

register_case cross_nginx_curl_sha256 case_nginx
