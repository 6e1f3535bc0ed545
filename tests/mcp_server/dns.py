"""A tiny DNS server for agentd's rebinding tests, on a network-namespace host: answers A
queries from a table given on the command line, NOERROR with no answer for other types of a
known name, NXDOMAIN for any other name, TTL 0. A name may have a list of answers: the Nth
query gets the Nth (the last one repeats), which is how a name "changes to 127.0.0.1 between
the check and the connect". Prints one line per query.

Usage: dns.py ADDRESS NAME=IP[,IP…] …
"""
import socket, struct, sys

address = sys.argv[1]
table = {}
for spec in sys.argv[2:]:
    name, ips = spec.split("=", 1)
    table[name.lower()] = ips.split(",")
asked = {}
server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
server.bind((address, 53))
print("ready", flush=True)
while True:
    data, peer = server.recvfrom(512)
    try:
        tid, _flags, qdcount = struct.unpack(">HHH", data[:6])
        i, labels = 12, []
        while data[i]:
            length = data[i]
            labels.append(data[i + 1:i + 1 + length].decode())
            i += 1 + length
        qtype, _qclass = struct.unpack(">HH", data[i + 1:i + 5])
        question = data[12:i + 5]
    except Exception:
        continue
    name = ".".join(labels).lower()
    answer, count, rcode = b"", 0, 0
    if name not in table:
        rcode = 3
    elif qtype == 1:
        n = asked.get(name, 0)
        asked[name] = n + 1
        ip = table[name][min(n, len(table[name]) - 1)]
        answer = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 0, 4) + socket.inet_aton(ip)
        count = 1
        print(f"A {name} -> {ip}", flush=True)
    header = struct.pack(">HHHHHH", tid, 0x8180 | rcode, 1, count, 0, 0)
    server.sendto(header + question + answer, peer)
