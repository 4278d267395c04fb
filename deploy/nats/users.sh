#!/bin/sh
# users.sh FEDERATION SITE... writes the NATS users of an edgefl federation
# (include it as edgefl-users.conf next to node.conf): the aggregator, with
# every topic of the federation, and one user per site, with exactly what
# deploy/mosquitto/edgefl.acl gives a site: publish its updates and its
# status, subscribe to the round announcement, the run spec and its own
# receipts. MQTT topics are NATS subjects with '/' as '.'; every MQTT
# client also needs $MQTT.sub.>, the subjects on which the node delivers
# its QoS 1 subscriptions (a site cannot read another's deliveries there:
# e2e/nats_test.go probes it). Users are
# matched by their certificate subject (node.conf's verify_and_map); with
# AGG_CN set, the aggregator's certificate common name is AGG_CN instead
# of "aggregator".
set -eu
if [ $# -lt 2 ]; then
  echo "usage: users.sh FEDERATION SITE..." >&2
  exit 2
fi
fed=$1
shift
p="edgefl.$fed"
agg=${AGG_CN:-aggregator}
echo "# edgefl federation \"$fed\": written by deploy/nats/users.sh; edit the site list there, not here."
echo "authorization {"
echo "  users = ["
echo "    {user: \"CN=$agg,O=edgefl\", permissions: {publish: \"$p.>\", subscribe: [\"$p.>\", \"\$MQTT.sub.>\"]}}"
for s in "$@"; do
  case $s in
    *[!A-Za-z0-9_-]*|'') echo "users.sh: site id \"$s\" is not one edgefl accepts (letters, digits, '-', '_')" >&2; exit 2 ;;
  esac
  echo "    {user: \"CN=$s,O=edgefl\", permissions: {publish: [\"$p.updates.$s\", \"$p.clients.$s.status\"], subscribe: [\"$p.round\", \"$p.run\", \"$p.receipts.$s\", \"\$MQTT.sub.>\"]}}"
done
echo "  ]"
echo "}"
