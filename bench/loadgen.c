/* MQTT 3.1.1 load generator for bench/mqtt_bench.py, built by bench/loadgen.py with gcc.
 *
 * One single-threaded epoll loop drives every publisher and subscriber of a run, so on a 2-core
 * machine it needs a fraction of one core while the broker under test has the other. Packets are
 * encoded once into templates; sending a message is a memcpy into the connection's output buffer
 * plus patching the packet id and the send timestamp, and output is written in large batches.
 * Publishers and subscribers share one clock, so latency is exact: the payload carries the
 * CLOCK_MONOTONIC time of the write, the subscriber subtracts it from the time of its read.
 *
 * Modes (each prints one JSON object per line on stdout; every loop is bounded in time):
 *   flow      P publishers -> S subscribers, QoS 0/1/2, end-to-end window, optional fixed rate
 *   conns     N idle connections: connects/s, then hold them until a line arrives on stdin
 *   retained  publish T retained topics, then N subscribers join at once: time to receive all
 *   session   persistent session offline while M QoS 1 messages queue, then time to drain them
 *   fleet     N idle clients spread over the nodes of --ports, a fraction with persistent sessions
 *             (clean session off, one QoS 1 subscription each), held; a client whose connection
 *             ends reconnects through the next port of the list, and the run reports how long
 *             that took and whether its session was resumed (status lines on request, see below)
 *
 * --port2 P addresses a second node of the same cluster (a separated deployment's second proxy):
 * subscribers connect to P and publishers to --port, so every message crosses from one node to
 * the other; idle connections (conns mode) alternate between the two. Without it, all use --port.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 0x68636e6562706f6dULL /* "mopbench" little-endian, marks timestamped payloads */
#define HIST_US 1000000             /* latency histogram: 1 us buckets up to 1 s */
#define OUT_HIGH (256 * 1024)       /* stop filling a publisher's buffer above this */
#define PUMP_MAX 4096               /* messages appended per pump before polling again */
#define READ_CHUNK (256 * 1024)
#define MAX_EVENTS 512
#define TIMER_TAG UINT32_MAX
#define LISTEN_TAG (UINT32_MAX - 1)
#define STDIN_TAG (UINT32_MAX - 2)
#define MAX_PORTS 64

enum { ROLE_PUB, ROLE_SUB, ROLE_IDLE };
enum { ST_FREE, ST_CONNECTING, ST_WAIT_CONNACK, ST_WAIT_SUBACK, ST_READY, ST_CLOSED };

typedef struct {
    uint8_t *p;
    size_t len, off, cap;
} Buf;

typedef struct {
    int fd;
    uint32_t idx;
    uint8_t role, state, epout, clean, leaving; /* leaving: sent DISCONNECT */
    char *filter;            /* subscribed after CONNACK when set */
    Buf in, out;
    uint32_t inflight;       /* outgoing QoS > 0 publishes not yet acknowledged */
    uint16_t next_pid;
    uint8_t *pid_used;       /* 65536-bit map of packet ids in use */
    int topic;               /* publisher's template index */
    /* fleet mode: when the connection was lost (0 while it is up), when the current attempt
     * started, not before when the next may start, attempts since the loss, which --ports entry */
    uint64_t lost_ns, attempt_ns, retry_at;
    uint16_t attempts;
    uint8_t port_i, persistent;
} Conn;

typedef struct {
    uint8_t *p;
    size_t len, pid_off, ts_off;
} Template;

static struct {
    const char *mode, *host, *prefix, *username, *ports;
    long port, port2, pubs, subs, qos, payload, window, inflight, topic_per_pub, wildcard, count;
    long conns, concurrency, src_ips, keepalive, topics, branches, sub_qos, prime;
    long port_offset, retries;
    double duration, rate, warmup, timeout, drain_idle, stall, hold, persistent, attempt_timeout;
} opt = {
    .mode = "flow", .host = "127.0.0.1", .prefix = "bench", .username = "bench", .port = 1883, .pubs = 1,
    .subs = 1, .qos = 0, .payload = 100, .window = 2000, .inflight = 100, .count = 100000,
    .conns = 1000, .concurrency = 200, .src_ips = 1, .keepalive = 300, .topics = 10000,
    .branches = 100, .sub_qos = -1, .duration = 3.0, .warmup = 0.0, .timeout = 30.0,
    .drain_idle = 1.0, .stall = 0.5, .hold = 60.0, .ports = "", .retries = 20,
    .attempt_timeout = 10.0,
};

typedef struct {
    const char *name;
    char kind; /* s: string, l: long, d: double */
    void *ptr;
} OptSpec;

static const OptSpec OPTIONS[] = {
    {"mode", 's', &opt.mode}, {"host", 's', &opt.host}, {"prefix", 's', &opt.prefix},
    {"username", 's', &opt.username},
    {"port", 'l', &opt.port}, {"port2", 'l', &opt.port2}, {"pubs", 'l', &opt.pubs}, {"subs", 'l', &opt.subs},
    {"qos", 'l', &opt.qos}, {"sub-qos", 'l', &opt.sub_qos}, {"payload", 'l', &opt.payload},
    {"window", 'l', &opt.window}, {"inflight", 'l', &opt.inflight},
    {"topic-per-pub", 'l', &opt.topic_per_pub}, {"wildcard", 'l', &opt.wildcard},
    {"count", 'l', &opt.count}, {"conns", 'l', &opt.conns},
    {"concurrency", 'l', &opt.concurrency}, {"src-ips", 'l', &opt.src_ips},
    {"keepalive", 'l', &opt.keepalive}, {"topics", 'l', &opt.topics},
    {"branches", 'l', &opt.branches}, {"prime", 'l', &opt.prime},
    {"duration", 'd', &opt.duration},
    {"rate", 'd', &opt.rate}, {"warmup", 'd', &opt.warmup}, {"timeout", 'd', &opt.timeout},
    {"drain-idle", 'd', &opt.drain_idle}, {"stall", 'd', &opt.stall}, {"hold", 'd', &opt.hold},
    {"ports", 's', &opt.ports}, {"port-offset", 'l', &opt.port_offset},
    {"persistent", 'd', &opt.persistent}, {"retries", 'l', &opt.retries},
    {"attempt-timeout", 'd', &opt.attempt_timeout},
};

/* Counters of the whole run. */
static struct {
    int ep, timer_fd;
    Conn *conns;
    uint32_t nconns;
    Template *templates;
    int ntemplates;
    uint64_t sent, acked, delivered, retained_rx, written_off, stalls;
    uint64_t ready, connected, failed, lost, subacked, suback_failures, pending_connects;
    uint64_t rate_allowed, progress_ns, first_rx_ns, last_rx_ns, lat_from_ns;
    uint64_t lat_count, lat_over, lat_max_ns, prime_ns;
    uint32_t *hist;
    long fan;
    int relay, listen_fd;
    /* fleet mode */
    long ports[MAX_PORTS];
    int nports, reconnect, quit;
    uint32_t *queue, qhead, qlen;   /* closed clients waiting to reconnect, FIFO */
    uint32_t *rc_us, nrc;            /* loss -> CONNACK time of every reconnect, in us */
    uint64_t refused, reconnected, resumed, not_resumed, gave_up, failed_attempts;
    uint64_t first_loss_ns, last_reconnect_ns;
    char line[256];
    size_t line_len;
} G;

static void die(const char *what) {
    fprintf(stderr, "loadgen: %s: %s\n", what, errno ? strerror(errno) : "error");
    exit(2);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static void parse_args(int argc, char **argv) {
    for (int i = 1; i < argc; i += 2) {
        const char *name = argv[i];
        if (strncmp(name, "--", 2) != 0 || i + 1 >= argc) {
            fprintf(stderr, "loadgen: usage: loadgen --name value ...\n");
            exit(2);
        }
        name += 2;
        size_t k = 0;
        for (; k < sizeof OPTIONS / sizeof OPTIONS[0]; k++) {
            if (strcmp(OPTIONS[k].name, name) != 0) continue;
            if (OPTIONS[k].kind == 's') *(const char **)OPTIONS[k].ptr = argv[i + 1];
            else if (OPTIONS[k].kind == 'l') *(long *)OPTIONS[k].ptr = strtol(argv[i + 1], 0, 10);
            else *(double *)OPTIONS[k].ptr = strtod(argv[i + 1], 0);
            break;
        }
        if (k == sizeof OPTIONS / sizeof OPTIONS[0]) {
            fprintf(stderr, "loadgen: unknown option --%s\n", name);
            exit(2);
        }
    }
    if (opt.sub_qos < 0) opt.sub_qos = opt.qos;
    if (opt.payload < 16) opt.payload = 16;
}

/* ---- buffers ------------------------------------------------------------------------------ */

static void buf_reserve(Buf *b, size_t extra) {
    if (b->off == b->len) b->off = b->len = 0;
    if (b->len + extra <= b->cap) return;
    if (b->off) {
        memmove(b->p, b->p + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
        if (b->len + extra <= b->cap) return;
    }
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + extra) cap *= 2;
    b->p = realloc(b->p, cap);
    if (!b->p) die("out of memory");
    b->cap = cap;
}

static uint8_t *buf_put(Buf *b, size_t n) {
    buf_reserve(b, n);
    uint8_t *w = b->p + b->len;
    b->len += n;
    return w;
}

static size_t buf_pending(const Buf *b) { return b->len - b->off; }

static void buf_free(Buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- encoding ----------------------------------------------------------------------------- */

static size_t varint_len(size_t v) { return v < 128 ? 1 : v < 16384 ? 2 : v < 2097152 ? 3 : 4; }

static uint8_t *put_varint(uint8_t *w, size_t v) {
    do {
        uint8_t d = v & 127;
        v >>= 7;
        *w++ = v ? (d | 128) : d;
    } while (v);
    return w;
}

static uint8_t *put_str(uint8_t *w, const char *s, size_t n) {
    *w++ = (uint8_t)(n >> 8);
    *w++ = (uint8_t)n;
    memcpy(w, s, n);
    return w + n;
}

/* Every client sends a user name (no password): amqtt queues nothing for anonymous sessions. */
static void encode_connect(Buf *b, const char *client_id, int clean) {
    size_t idlen = strlen(client_id), userlen = strlen(opt.username);
    size_t body = 10 + 2 + idlen + (userlen ? 2 + userlen : 0);
    uint8_t *w = buf_put(b, 1 + varint_len(body) + body);
    *w++ = 0x10;
    w = put_varint(w, body);
    w = put_str(w, "MQTT", 4);
    *w++ = 4;
    *w++ = (uint8_t)((clean ? 0x02 : 0x00) | (userlen ? 0x80 : 0x00));
    *w++ = (uint8_t)(opt.keepalive >> 8);
    *w++ = (uint8_t)opt.keepalive;
    w = put_str(w, client_id, idlen);
    if (userlen) put_str(w, opt.username, userlen);
}

static void encode_subscribe(Buf *b, const char *filter, int qos) {
    size_t flen = strlen(filter), body = 2 + 2 + flen + 1;
    uint8_t *w = buf_put(b, 1 + varint_len(body) + body);
    *w++ = 0x82;
    w = put_varint(w, body);
    *w++ = 0;
    *w++ = 1;
    w = put_str(w, filter, flen);
    *w = (uint8_t)qos;
}

static void encode_ack(Buf *b, uint8_t first, uint16_t pid) {
    uint8_t *w = buf_put(b, 4);
    w[0] = first;
    w[1] = 2;
    w[2] = (uint8_t)(pid >> 8);
    w[3] = (uint8_t)pid;
}

static int make_template(const char *topic, int qos, int retain) {
    size_t tlen = strlen(topic), body = 2 + tlen + (qos ? 2 : 0) + (size_t)opt.payload;
    Template t = {0};
    t.len = 1 + varint_len(body) + body;
    t.p = malloc(t.len);
    if (!t.p) die("out of memory");
    uint8_t *w = t.p;
    *w++ = (uint8_t)(0x30 | (qos << 1) | (retain ? 1 : 0));
    w = put_varint(w, body);
    w = put_str(w, topic, tlen);
    if (qos) {
        t.pid_off = (size_t)(w - t.p);
        w += 2;
    }
    t.ts_off = (size_t)(w - t.p);
    uint64_t zero = 0, magic = MAGIC;
    memcpy(w, &zero, 8);
    memcpy(w + 8, &magic, 8);
    memset(w + 16, 'x', (size_t)opt.payload - 16);
    G.templates = realloc(G.templates, sizeof(Template) * (size_t)(G.ntemplates + 1));
    G.templates[G.ntemplates] = t;
    return G.ntemplates++;
}

static uint16_t alloc_pid(Conn *c) {
    if (!c->pid_used) {
        c->pid_used = calloc(8192, 1);
        if (!c->pid_used) die("out of memory");
    }
    for (;;) {
        uint16_t pid = ++c->next_pid;
        if (pid == 0) continue;
        if (!(c->pid_used[pid >> 3] & (1 << (pid & 7)))) {
            c->pid_used[pid >> 3] |= (uint8_t)(1 << (pid & 7));
            return pid;
        }
    }
}

static int release_pid(Conn *c, uint16_t pid) {
    if (!c->pid_used || !(c->pid_used[pid >> 3] & (1 << (pid & 7)))) return 0;
    c->pid_used[pid >> 3] &= (uint8_t)~(1 << (pid & 7));
    return 1;
}

static void append_publish(Conn *c, const Template *t, uint64_t ts) {
    uint8_t *w = buf_put(&c->out, t->len);
    memcpy(w, t->p, t->len);
    if (t->pid_off) {
        uint16_t pid = alloc_pid(c);
        w[t->pid_off] = (uint8_t)(pid >> 8);
        w[t->pid_off + 1] = (uint8_t)pid;
        c->inflight++;
    }
    memcpy(w + t->ts_off, &ts, 8);
    G.sent++;
}

/* ---- connections -------------------------------------------------------------------------- */

static void client_id(const Conn *c, char *out, size_t n) {
    static const char ROLE[] = {'p', 's', 'c'};
    snprintf(out, n, "%s%c%u", opt.prefix, ROLE[c->role], c->idx);
}

/* Idle connections are registered edge-triggered for reads and writes at once, so connecting
 * one costs no epoll_ctl beyond the first: the connection rate is the broker's, not ours. */
static int lean(const Conn *c) { return c->role == ROLE_IDLE; }

static void set_events(Conn *c, int want_out) {
    if (c->epout == want_out || lean(c)) return;
    struct epoll_event ev = {.events = EPOLLIN | (want_out ? EPOLLOUT : 0), .data.u32 = c->idx};
    if (epoll_ctl(G.ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl");
    c->epout = (uint8_t)want_out;
}

static void fleet_closed(Conn *c, uint8_t was);
static void fleet_reconnected(Conn *c, int resumed, uint64_t now);

static void conn_close(Conn *c, int lost) {
    if (c->state == ST_FREE || c->state == ST_CLOSED) return;
    uint8_t was = c->state;
    if (c->state == ST_CONNECTING || c->state == ST_WAIT_CONNACK) {
        G.failed++;
        G.pending_connects--;
    } else if (lost && !c->leaving) {
        G.lost++;
    }
    struct linger lg = {1, 0}; /* reset, so no TIME_WAIT piles up across runs */
    setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(c->fd);
    c->fd = -1;
    c->state = ST_CLOSED;
    buf_free(&c->in);
    buf_free(&c->out);
    if (G.reconnect) fleet_closed(c, was);
}

static void conn_flush(Conn *c) {
    while (buf_pending(&c->out)) {
        ssize_t n = write(c->fd, c->out.p + c->out.off, buf_pending(&c->out));
        if (n > 0) {
            c->out.off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) {
            set_events(c, 1);
            return;
        }
        conn_close(c, 1);
        return;
    }
    c->out.off = c->out.len = 0;
    set_events(c, 0);
}

/* Subscribers and every other idle connection go to the second node when there is one. */
static long conn_port(const Conn *c) {
    if (G.nports) return G.ports[c->port_i];
    if (!opt.port2) return opt.port;
    if (c->role == ROLE_SUB || (c->role == ROLE_IDLE && c->idx % 2)) return opt.port2;
    return opt.port;
}

static void conn_open(Conn *c) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket");
    int one = 1;
    if (!lean(c)) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (opt.src_ips > 1) {
        /* Spread connections over 127.0.0.x so one source address's ephemeral ports suffice. */
        struct sockaddr_in src = {.sin_family = AF_INET};
        src.sin_addr.s_addr = htonl(0x7f000001u + c->idx % (uint32_t)opt.src_ips);
        setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
        if (bind(fd, (struct sockaddr *)&src, sizeof src) < 0) die("bind");
    }
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)conn_port(c))};
    inet_pton(AF_INET, opt.host, &dst.sin_addr);
    c->fd = fd;
    c->state = ST_CONNECTING;
    c->epout = 1;
    G.pending_connects++;
    if (connect(fd, (struct sockaddr *)&dst, sizeof dst) < 0 && errno != EINPROGRESS) {
        c->epout = 0;
        close(fd);
        c->state = ST_CLOSED;
        G.failed++;
        G.pending_connects--;
        if (G.reconnect) fleet_closed(c, ST_CONNECTING);
        return;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | (lean(c) ? EPOLLET : 0),
                             .data.u32 = c->idx};
    if (epoll_ctl(G.ep, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl add");
}

static Conn *add_conn(uint8_t role, int clean, char *filter) {
    Conn *c = &G.conns[G.nconns];
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->idx = G.nconns++;
    c->role = role;
    c->clean = (uint8_t)clean;
    c->filter = filter;
    return c;
}

static void on_connected(Conn *c) {
    int err = 0;
    socklen_t len = sizeof err;
    /* A lean connection learns of a failed connect from the write of its CONNECT instead. */
    if (!lean(c)) getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err) {
        conn_close(c, 0);
        return;
    }
    char id[64];
    client_id(c, id, sizeof id);
    c->state = ST_WAIT_CONNACK;
    encode_connect(&c->out, id, c->clean);
    conn_flush(c);
}

/* ---- receiving ---------------------------------------------------------------------------- */

static void record_latency(uint64_t sent_ns, uint64_t rx_ns) {
    if (sent_ns < G.lat_from_ns || rx_ns < sent_ns) return;
    uint64_t d = rx_ns - sent_ns;
    uint64_t us = d / 1000;
    if (us < HIST_US) G.hist[us]++;
    else G.lat_over++;
    if (d > G.lat_max_ns) G.lat_max_ns = d;
    G.lat_count++;
}

static void on_publish(Conn *c, uint8_t first, const uint8_t *body, size_t len, uint64_t rx) {
    int qos = (first >> 1) & 3;
    if (len < 2) return;
    size_t pos = 2 + ((size_t)body[0] << 8 | body[1]);
    uint16_t pid = 0;
    if (qos) {
        if (pos + 2 > len) return;
        pid = (uint16_t)(body[pos] << 8 | body[pos + 1]);
        pos += 2;
    }
    if (pos > len) return;
    G.delivered++;
    if (first & 1) G.retained_rx++;
    if (!G.first_rx_ns) G.first_rx_ns = rx;
    G.last_rx_ns = G.progress_ns = rx;
    uint64_t magic, ts;
    if (len - pos >= 16) {
        memcpy(&magic, body + pos + 8, 8);
        if (magic == MAGIC) {
            memcpy(&ts, body + pos, 8);
            record_latency(ts, rx);
        }
    }
    if (qos == 1) encode_ack(&c->out, 0x40, pid);
    else if (qos == 2) encode_ack(&c->out, 0x50, pid);
}

static void on_packet(Conn *c, uint8_t first, const uint8_t *body, size_t len, uint64_t rx) {
    uint16_t pid = len >= 2 ? (uint16_t)(body[0] << 8 | body[1]) : 0;
    switch (first >> 4) {
    case 2: /* CONNACK */
        if (c->state != ST_WAIT_CONNACK) return;
        if (len < 2 || body[1] != 0) {
            G.refused++;
            conn_close(c, 0); /* counted as failed there */
            return;
        }
        G.pending_connects--;
        G.connected++;
        int resumed = c->persistent && (body[0] & 1);
        if (c->lost_ns) fleet_reconnected(c, resumed, rx);
        if (c->filter && !resumed) {
            c->state = ST_WAIT_SUBACK;
            encode_subscribe(&c->out, c->filter, (int)opt.sub_qos);
        } else {
            c->state = ST_READY;
            G.ready++;
        }
        return;
    case 3:
        on_publish(c, first, body, len, rx);
        return;
    case 4: /* PUBACK */
    case 7: /* PUBCOMP */
        if (release_pid(c, pid)) {
            c->inflight--;
            G.acked++;
            G.progress_ns = rx;
        }
        return;
    case 5: /* PUBREC */
        encode_ack(&c->out, 0x62, pid);
        return;
    case 6: /* PUBREL */
        encode_ack(&c->out, 0x70, pid);
        return;
    case 9: /* SUBACK */
        if (c->state == ST_WAIT_SUBACK) {
            G.subacked++;
            if (len >= 3 && body[2] == 0x80) G.suback_failures++;
            c->state = ST_READY;
            G.ready++;
        }
        return;
    default:
        return;
    }
}

static void relay_packet(Conn *c, const uint8_t *raw, size_t len);
static void fleet_command(void);

/* Hand every complete packet in p[0, avail) to on_packet; returns the bytes consumed. */
static size_t parse_packets(Conn *c, const uint8_t *p, size_t avail, uint64_t rx) {
    size_t used = 0;
    while (c->state != ST_CLOSED) {
        const uint8_t *q = p + used;
        size_t left = avail - used, rl = 0, i = 1;
        int shift = 0, complete = 0;
        while (i < left && i <= 4) {
            uint8_t d = q[i++];
            rl |= (size_t)(d & 127) << shift;
            shift += 7;
            if (!(d & 128)) {
                complete = 1;
                break;
            }
        }
        if (!complete || left < i + rl) break;
        if (G.relay) relay_packet(c, q, i + rl);
        else on_packet(c, q[0], q + i, rl, rx);
        used += i + rl;
    }
    return used;
}

/* Reads go to one shared buffer, so idle connections own no read buffer; only the bytes of an
 * incomplete packet are kept per connection, and put back in front of the next read. */
static uint8_t read_buf[READ_CHUNK];

static void conn_read(Conn *c, uint64_t rx) {
    for (int round = 0; round < 4 && c->state != ST_CLOSED; round++) {
        size_t tail = buf_pending(&c->in);
        ssize_t n;
        if (tail > READ_CHUNK / 2) { /* a large packet in progress: collect it in place */
            buf_reserve(&c->in, READ_CHUNK);
            n = read(c->fd, c->in.p + c->in.len, READ_CHUNK);
            if (n > 0) {
                c->in.len += (size_t)n;
                size_t used = parse_packets(c, c->in.p + c->in.off, buf_pending(&c->in), rx);
                if (c->state != ST_CLOSED) c->in.off += used;
            }
        } else {
            if (tail) memcpy(read_buf, c->in.p + c->in.off, tail);
            n = read(c->fd, read_buf + tail, READ_CHUNK - tail);
            if (n > 0) {
                c->in.off = c->in.len = 0;
                size_t total = tail + (size_t)n, used = parse_packets(c, read_buf, total, rx);
                if (used < total && c->state != ST_CLOSED)
                    memcpy(buf_put(&c->in, total - used), read_buf + used, total - used);
            }
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
        if (n <= 0) {
            conn_close(c, 1);
            return;
        }
        if (c->state == ST_CLOSED) return;
        if ((size_t)n < READ_CHUNK - tail) break;
    }
    if (c->state != ST_CLOSED && buf_pending(&c->out)) conn_flush(c);
}

static void relay_accept(void);

/* One epoll_wait and its events; returns the time after the wait. */
static uint64_t poll_once(int timeout_ms) {
    struct epoll_event evs[MAX_EVENTS];
    int n = epoll_wait(G.ep, evs, MAX_EVENTS, timeout_ms);
    if (n < 0 && errno != EINTR) die("epoll_wait");
    uint64_t now = now_ns();
    for (int k = 0; k < n; k++) {
        uint32_t tag = evs[k].data.u32;
        if (tag == LISTEN_TAG) {
            relay_accept();
            continue;
        }
        if (tag == STDIN_TAG) {
            fleet_command();
            continue;
        }
        if (tag == TIMER_TAG) {
            uint64_t expirations = 0;
            if (read(G.timer_fd, &expirations, sizeof expirations) == sizeof expirations)
                G.rate_allowed += expirations;
            continue;
        }
        Conn *c = &G.conns[tag];
        if (c->state == ST_CLOSED || c->state == ST_FREE) continue;
        if (c->state == ST_CONNECTING) {
            on_connected(c);
            continue;
        }
        if (evs[k].events & EPOLLOUT) conn_flush(c);
        if (c->state != ST_CLOSED && evs[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
            conn_read(c, now);
    }
    return now;
}

/* Open connections [first, last) at most `opt.concurrency` handshakes at a time, until every
 * one is ready or failed; returns 0 on time-out. */
static int connect_all(uint32_t first, uint32_t last, uint64_t deadline) {
    uint32_t next = first;
    uint64_t target = G.ready + G.failed + (last - first);
    while (G.ready + G.failed < target) {
        while (next < last && G.pending_connects < (uint64_t)opt.concurrency) conn_open(&G.conns[next++]);
        if (poll_once(5) > deadline) return 0;
    }
    return 1;
}

/* ---- output ------------------------------------------------------------------------------- */

static double percentile_us(double q) {
    if (!G.lat_count) return -1;
    uint64_t want = (uint64_t)(q * (double)G.lat_count), seen = 0;
    if (want >= G.lat_count) want = G.lat_count - 1;
    for (uint32_t us = 0; us < HIST_US; us++) {
        seen += G.hist[us];
        if (seen > want) return us + 0.5;
    }
    return G.lat_max_ns / 1000.0;
}

static void print_common(void) {
    printf("\"sent\": %lu, \"acked\": %lu, \"delivered\": %lu, \"retained_rx\": %lu, "
           "\"connected\": %lu, \"failed\": %lu, \"lost\": %lu, \"suback_failures\": %lu, "
           "\"stalls\": %lu, \"lat_count\": %lu, \"lat_p50_us\": %.1f, \"lat_p99_us\": %.1f, "
           "\"lat_max_us\": %.1f",
           G.sent, G.acked, G.delivered, G.retained_rx, G.connected, G.failed, G.lost,
           G.suback_failures, G.stalls, G.lat_count, percentile_us(0.50), percentile_us(0.99),
           G.lat_max_ns / 1000.0);
}

/* ---- modes -------------------------------------------------------------------------------- */

static int window_open(void) {
    uint64_t settled = (G.delivered + G.written_off) / (uint64_t)G.fan;
    return G.sent < settled + (uint64_t)opt.window;
}

/* Append messages to the publishers' buffers round robin and write them; returns 1 when it
 * stopped only because of PUMP_MAX, i.e. it could go on at once. */
static int pump(uint32_t first_pub, uint32_t npubs, uint64_t limit, int rate_limited) {
    static uint32_t turn;
    uint64_t ts = now_ns();
    int appended = 0, progress = 1;
    while (progress && appended < PUMP_MAX) {
        progress = 0;
        for (uint32_t k = 0; k < npubs && appended < PUMP_MAX; k++) {
            if (G.sent >= limit || !window_open()) goto done;
            if (rate_limited && G.sent >= G.rate_allowed) goto done;
            Conn *c = &G.conns[first_pub + (turn + k) % npubs];
            if (c->state != ST_READY || buf_pending(&c->out) >= OUT_HIGH) continue;
            if (opt.qos && c->inflight >= (uint32_t)opt.inflight) continue;
            append_publish(c, &G.templates[c->topic], ts);
            appended++;
            progress = 1;
        }
        turn++;
    }
done:
    for (uint32_t k = 0; k < npubs; k++) {
        Conn *c = &G.conns[first_pub + k];
        if (c->state == ST_READY && buf_pending(&c->out) && !c->epout) conn_flush(c);
    }
    return appended >= PUMP_MAX;
}

/* --prime 1: one message on every publisher's topic, then wait until the subscribers have them
 * all (and publishes at QoS > 0 are acknowledged) before the measured flow starts. A wildcard
 * subscription may learn of new topics only later (a separated proxy polls for them); priming
 * measures the flow once every topic is known, and reports the wait as prime_s. */
static int prime(uint32_t first_pub, uint64_t deadline) {
    uint64_t t0 = now_ns(), now = t0;
    for (long i = 0; i < opt.pubs; i++) {
        Conn *c = &G.conns[first_pub + (uint32_t)i];
        append_publish(c, &G.templates[c->topic], t0);
        if (!c->epout) conn_flush(c);
    }
    uint64_t per_sub = opt.wildcard || !opt.topic_per_pub ? (uint64_t)opt.pubs : 1;
    uint64_t want = per_sub * (uint64_t)opt.subs;
    while (now < deadline && (G.delivered < want || (opt.qos && G.acked < G.sent)))
        now = poll_once(2);
    int ok = G.delivered >= want && (!opt.qos || G.acked >= G.sent);
    G.prime_ns = now - t0;
    G.sent = G.acked = G.delivered = G.retained_rx = 0;
    G.first_rx_ns = G.last_rx_ns = 0;
    G.lat_count = G.lat_over = G.lat_max_ns = 0;
    memset(G.hist, 0, HIST_US * sizeof *G.hist);
    return ok;
}

static int run_flow(uint64_t t_start, uint64_t deadline) {
    char topic[256], filter[256];
    G.fan = opt.subs;
    snprintf(filter, sizeof filter, opt.wildcard ? "%s/t/+" : "%s/t/0", opt.prefix);
    for (long i = 0; i < opt.subs; i++) add_conn(ROLE_SUB, 1, filter);
    uint32_t first_pub = G.nconns;
    for (long i = 0; i < opt.pubs; i++) {
        Conn *c = add_conn(ROLE_PUB, 1, NULL);
        snprintf(topic, sizeof topic, "%s/t/%ld", opt.prefix, opt.topic_per_pub ? i : 0L);
        c->topic = make_template(topic, (int)opt.qos, 0);
    }
    if (!connect_all(0, G.nconns, deadline) || G.failed || G.suback_failures) {
        printf("{\"mode\": \"flow\", \"error\": \"not all clients connected and subscribed\", ");
        print_common();
        printf("}\n");
        return 1;
    }
    if (opt.prime && !prime(first_pub, deadline)) {
        printf("{\"mode\": \"flow\", \"error\": \"priming messages not delivered in time\", "
               "\"prime_s\": %.3f, ", G.prime_ns / 1e9);
        print_common();
        printf("}\n");
        return 1;
    }
    int rate_limited = opt.rate > 0;
    if (rate_limited) {
        G.timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        long period = (long)(1e9 / opt.rate);
        struct itimerspec its = {{period / 1000000000L, period % 1000000000L},
                                 {period / 1000000000L, period % 1000000000L}};
        timerfd_settime(G.timer_fd, 0, &its, NULL);
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = TIMER_TAG};
        epoll_ctl(G.ep, EPOLL_CTL_ADD, G.timer_fd, &ev);
    }
    double cpu0 = cpu_seconds();
    uint64_t t0 = now_ns(), send_end = t0 + (uint64_t)(opt.duration * 1e9), now = t0, t_sent = 0;
    G.lat_from_ns = t0 + (uint64_t)(opt.warmup * 1e9);
    G.progress_ns = t0;
    uint64_t drain_idle = (uint64_t)(opt.drain_idle * 1e9), stall = (uint64_t)(opt.stall * 1e9);
    int sending = 1, more = 0;
    while (now < deadline) {
        if (sending && (G.sent >= (uint64_t)opt.count || now >= send_end)) {
            sending = 0;
            t_sent = now;
            G.progress_ns = now;
        }
        more = sending ? pump(first_pub, (uint32_t)opt.pubs, (uint64_t)opt.count, rate_limited) : 0;
        uint64_t expected = G.sent * (uint64_t)G.fan;
        if (!sending) {
            if (G.delivered >= expected && (!opt.qos || G.acked >= G.sent)) break;
            if (now - G.progress_ns > drain_idle) break;
        } else if (!window_open() && now - G.progress_ns > stall) {
            /* QoS 0 messages the broker dropped never arrive: give their window slots back. */
            G.written_off = expected - G.delivered;
            G.stalls++;
            G.progress_ns = now;
        }
        now = poll_once(more ? 0 : 2);
    }
    double cpu = cpu_seconds() - cpu0;
    uint64_t end = G.last_rx_ns > t0 ? G.last_rx_ns : now;
    double elapsed = (end - t0) / 1e9;
    printf("{\"mode\": \"flow\", \"elapsed_s\": %.4f, \"send_s\": %.4f, \"expected\": %lu, "
           "\"msgs_per_s\": %.1f, \"deliveries_per_s\": %.1f, \"acked_per_s\": %.1f, "
           "\"loadgen_cpu\": %.3f, \"setup_s\": %.3f, \"prime_s\": %.3f, ",
           elapsed, ((t_sent ? t_sent : now) - t0) / 1e9, G.sent * (uint64_t)G.fan,
           G.delivered / (double)G.fan / elapsed, G.delivered / elapsed, G.acked / elapsed,
           cpu / ((now - t0) / 1e9), (t0 - t_start) / 1e9, G.prime_ns / 1e9);
    print_common();
    printf("}\n");
    return 0;
}

static int run_conns(uint64_t t_start, uint64_t deadline) {
    for (long i = 0; i < opt.conns; i++) add_conn(ROLE_IDLE, 1, NULL);
    double cpu0 = cpu_seconds();
    int complete = connect_all(0, G.nconns, deadline);
    uint64_t t1 = now_ns();
    double secs = (t1 - t_start) / 1e9;
    printf("{\"mode\": \"conns\", \"complete\": %d, \"connect_s\": %.4f, \"connects_per_s\": %.1f, "
           "\"loadgen_cpu\": %.3f, ",
           complete, secs, G.connected / secs, (cpu_seconds() - cpu0) / secs);
    print_common();
    printf("}\n");
    fflush(stdout);
    /* Hold the connections until the runner has measured the broker (a line or EOF on stdin). */
    uint64_t hold_end = t1 + (uint64_t)(opt.hold * 1e9);
    for (;;) {
        fd_set rd;
        FD_ZERO(&rd);
        FD_SET(0, &rd);
        struct timeval tv = {0, 0};
        if (select(1, &rd, NULL, NULL, &tv) > 0) break;
        if (poll_once(20) > hold_end) break;
    }
    printf("{\"mode\": \"conns-held\", \"open\": %lu, \"lost\": %lu}\n", G.connected - G.lost, G.lost);
    return 0;
}

static int run_retained(uint64_t t_start, uint64_t deadline) {
    char topic[256];
    long per_branch = opt.topics / opt.branches;
    Conn *pub = add_conn(ROLE_PUB, 1, NULL);
    for (long i = 0; i < opt.topics; i++) {
        snprintf(topic, sizeof topic, "%s/r/%ld/%ld", opt.prefix, i % opt.branches, i / opt.branches);
        make_template(topic, 1, 1);
    }
    if (!connect_all(0, 1, deadline)) {
        printf("{\"mode\": \"retained\", \"error\": \"publisher did not connect\"}\n");
        return 1;
    }
    /* Setup: every retained topic once, QoS 1, `inflight` in flight, all acknowledged. */
    uint64_t ts = now_ns();
    while (G.acked < (uint64_t)opt.topics && ts < deadline) {
        while (G.sent < (uint64_t)opt.topics && pub->inflight < (uint32_t)opt.inflight &&
               buf_pending(&pub->out) < OUT_HIGH) {
            pub->topic = (int)G.sent;
            append_publish(pub, &G.templates[pub->topic], ts);
        }
        if (buf_pending(&pub->out) && !pub->epout) conn_flush(pub);
        ts = poll_once(2);
    }
    uint64_t t_setup = now_ns();
    G.delivered = G.retained_rx = 0;
    G.first_rx_ns = G.last_rx_ns = 0;
    char *filters = malloc((size_t)opt.subs * 128);
    for (long i = 0; i < opt.subs; i++) {
        char *f = filters + i * 128;
        snprintf(f, 128, "%s/r/%ld/#", opt.prefix, i % opt.branches);
        add_conn(ROLE_SUB, 1, f);
    }
    double cpu0 = cpu_seconds();
    uint64_t t0 = now_ns(), expected = (uint64_t)opt.subs * (uint64_t)per_branch, t_subscribed = 0;
    uint32_t next = 1;
    G.progress_ns = t0;
    uint64_t target_ready = G.ready + (uint64_t)opt.subs;
    uint64_t now = t0;
    while (now < deadline && G.delivered < expected) {
        while (next < G.nconns && G.pending_connects < (uint64_t)opt.concurrency)
            conn_open(&G.conns[next++]);
        now = poll_once(2);
        if (!t_subscribed && G.ready + G.failed >= target_ready) t_subscribed = now;
        if (t_subscribed && now - G.progress_ns > (uint64_t)(opt.drain_idle * 1e9)) break;
    }
    uint64_t end = G.delivered >= expected ? G.last_rx_ns : now;
    double secs = (end - t0) / 1e9;
    printf("{\"mode\": \"retained\", \"setup_s\": %.3f, \"storm_s\": %.4f, \"subscribed_s\": %.4f, "
           "\"expected\": %lu, \"deliveries_per_s\": %.1f, \"loadgen_cpu\": %.3f, ",
           (t_setup - t_start) / 1e9, secs, t_subscribed ? (t_subscribed - t0) / 1e9 : -1.0,
           expected, G.delivered / secs, (cpu_seconds() - cpu0) / ((now - t0) / 1e9));
    print_common();
    printf("}\n");
    return 0;
}

static int run_session(uint64_t t_start, uint64_t deadline) {
    char topic[256], filter[256];
    snprintf(topic, sizeof topic, "%s/q", opt.prefix);
    snprintf(filter, sizeof filter, "%s/q", opt.prefix);
    Conn *sub = add_conn(ROLE_SUB, 0, filter);
    Conn *pub = add_conn(ROLE_PUB, 1, NULL);
    pub->topic = make_template(topic, 1, 0);
    if (!connect_all(0, 2, deadline)) {
        printf("{\"mode\": \"session\", \"error\": \"clients did not connect\"}\n");
        return 1;
    }
    /* The subscriber leaves; its session keeps the subscription. */
    uint8_t *w = buf_put(&sub->out, 2);
    w[0] = 0xe0;
    w[1] = 0;
    sub->leaving = 1;
    conn_flush(sub);
    uint64_t until = now_ns() + 200000000ULL;
    while (poll_once(5) < until) {
    }
    conn_close(sub, 0);
    until = now_ns() + 200000000ULL;
    while (poll_once(5) < until) {
    }
    uint64_t ts = now_ns();
    while (G.acked < (uint64_t)opt.count && ts < deadline && pub->state == ST_READY) {
        while (G.sent < (uint64_t)opt.count && pub->inflight < (uint32_t)opt.inflight &&
               buf_pending(&pub->out) < OUT_HIGH)
            append_publish(pub, &G.templates[pub->topic], ts);
        if (buf_pending(&pub->out) && !pub->epout) conn_flush(pub);
        ts = poll_once(2);
    }
    uint64_t t_setup = now_ns();
    /* Back it comes: time from reconnecting until every queued message has arrived. */
    G.delivered = 0;
    G.last_rx_ns = 0;
    sub->filter = NULL;
    sub->leaving = 0;
    sub->state = ST_FREE;
    double cpu0 = cpu_seconds();
    uint64_t t0 = now_ns(), now = t0;
    conn_open(sub);
    G.progress_ns = t0;
    while (now < deadline && G.delivered < (uint64_t)opt.count) {
        now = poll_once(2);
        if (now - G.progress_ns > (uint64_t)(opt.drain_idle * 1e9) + 1000000000ULL) break;
    }
    uint64_t end = G.delivered >= (uint64_t)opt.count ? G.last_rx_ns : now;
    double secs = (end - t0) / 1e9;
    printf("{\"mode\": \"session\", \"setup_s\": %.3f, \"drain_s\": %.4f, \"expected\": %ld, "
           "\"msgs_per_s\": %.1f, \"loadgen_cpu\": %.3f, ",
           (t_setup - t_start) / 1e9, secs, opt.count, G.delivered / secs,
           (cpu_seconds() - cpu0) / ((now - t0) / 1e9));
    print_common();
    printf("}\n");
    return 0;
}

/* ---- fleet: many idle clients across the nodes of a cluster, reconnecting when one dies ----- */

static void fleet_enqueue(Conn *c, uint64_t not_before) {
    c->retry_at = not_before;
    G.queue[(G.qhead + G.qlen++) % G.nconns] = c->idx;
}

/* A client's connection ended: an established one starts reconnecting at once through another
 * port (the clients of one port spread evenly over the others); a failed attempt tries the next
 * port of the list, pausing once it has tried them all, and gives up after --retries attempts. */
static void fleet_closed(Conn *c, uint8_t was) {
    uint64_t now = now_ns();
    if (!c->lost_ns) {
        if (was == ST_CONNECTING || was == ST_WAIT_CONNACK) return; /* never connected */
        c->lost_ns = now;
        c->attempts = 0;
        if (!G.first_loss_ns) G.first_loss_ns = now;
    } else if (++c->attempts >= opt.retries) {
        G.gave_up++;
        return;
    } else {
        G.failed_attempts++;
        c->port_i = (uint8_t)((c->port_i + 1) % G.nports);
    }
    if (!c->attempts && G.nports > 1) {
        /* The clients of one port spread evenly over the others, as clients that each list
         * the nodes in an order of their own would. */
        uint32_t step = 1 + (c->idx / (uint32_t)G.nports) % (uint32_t)(G.nports - 1);
        c->port_i = (uint8_t)((c->port_i + step) % G.nports);
    }
    uint64_t pause = c->attempts && c->attempts % G.nports == 0 ? 200000000ULL : 0;
    fleet_enqueue(c, now + pause);
}

static void fleet_reconnected(Conn *c, int resumed, uint64_t now) {
    uint64_t us = (now - c->lost_ns) / 1000;
    if (G.nrc < 2 * G.nconns) G.rc_us[G.nrc++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
    G.reconnected++;
    if (resumed) G.resumed++;
    else if (c->persistent) G.not_resumed++; /* it subscribes again */
    G.last_reconnect_ns = now;
    c->lost_ns = 0;
}

/* Start queued reconnects, at most --concurrency handshakes at a time. */
static void fleet_pump(uint64_t now) {
    while (G.qlen && G.pending_connects < (uint64_t)opt.concurrency) {
        Conn *c = &G.conns[G.queue[G.qhead]];
        if (c->retry_at > now) break;
        G.qhead = (G.qhead + 1) % G.nconns;
        G.qlen--;
        c->attempt_ns = now;
        conn_open(c);
    }
}

/* Attempts that got no CONNACK within --attempt-timeout count as failed. */
static void fleet_expire(uint64_t now) {
    uint64_t limit = (uint64_t)(opt.attempt_timeout * 1e9);
    for (uint32_t i = 0; i < G.nconns; i++) {
        Conn *c = &G.conns[i];
        if (c->lost_ns && (c->state == ST_CONNECTING || c->state == ST_WAIT_CONNACK) &&
            now - c->attempt_ns > limit)
            conn_close(c, 0);
    }
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void fleet_status(const char *mode) {
    uint64_t open = 0, persistent_open = 0, waiting = 0;
    for (uint32_t i = 0; i < G.nconns; i++) {
        Conn *c = &G.conns[i];
        if (c->state == ST_READY) {
            open++;
            persistent_open += c->persistent;
        }
        if (c->lost_ns) waiting++;
    }
    qsort(G.rc_us, G.nrc, sizeof *G.rc_us, cmp_u32);
    double min = G.nrc ? G.rc_us[0] / 1000.0 : -1;
    double p50 = G.nrc ? G.rc_us[G.nrc / 2] / 1000.0 : -1;
    double p99 = G.nrc ? G.rc_us[(size_t)(G.nrc * 0.99)] / 1000.0 : -1;
    double max = G.nrc ? G.rc_us[G.nrc - 1] / 1000.0 : -1;
    printf("{\"mode\": \"%s\", \"clients\": %u, \"open\": %lu, \"persistent_open\": %lu, "
           "\"waiting\": %lu, \"reconnected\": %lu, \"resumed\": %lu, \"not_resumed\": %lu, "
           "\"gave_up\": %lu, \"failed_attempts\": %lu, \"refused\": %lu, "
           "\"first_loss_ns\": %lu, \"last_reconnect_ns\": %lu, \"reconnect_min_ms\": %.1f, "
           "\"reconnect_p50_ms\": %.1f, "
           "\"reconnect_p99_ms\": %.1f, \"reconnect_max_ms\": %.1f, \"loadgen_cpu_s\": %.3f, ",
           mode, G.nconns, open, persistent_open, waiting, G.reconnected, G.resumed,
           G.not_resumed, G.gave_up, G.failed_attempts, G.refused, G.first_loss_ns,
           G.last_reconnect_ns, min, p50, p99, max, cpu_seconds());
    print_common();
    printf("}\n");
    fflush(stdout);
}

/* A line on stdin: "status" prints a status line, "done" (or end of input) ends the hold. */
static void fleet_command(void) {
    char chunk[128];
    ssize_t n = read(0, chunk, sizeof chunk);
    if (n <= 0) {
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) G.quit = 1;
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        if (chunk[i] != '\n') {
            if (G.line_len < sizeof G.line - 1) G.line[G.line_len++] = chunk[i];
            continue;
        }
        G.line[G.line_len] = 0;
        G.line_len = 0;
        if (!strcmp(G.line, "status")) fleet_status("fleet-status");
        else if (!strcmp(G.line, "done")) G.quit = 1;
    }
}

static int fleet_ports(void) {
    char *list = strdup(opt.ports), *save = NULL;
    for (char *p = strtok_r(list, ",", &save); p && G.nports < MAX_PORTS;
         p = strtok_r(NULL, ",", &save))
        G.ports[G.nports++] = strtol(p, 0, 10);
    free(list);
    return G.nports;
}

/* Client i connects first to ports[(i + port_offset) % n]; a fraction --persistent of them
 * (spread evenly) keeps a persistent session subscribed at QoS --sub-qos to {prefix}/s/{i}. */
static int run_fleet(uint64_t t_start, uint64_t deadline) {
    if (!fleet_ports()) {
        printf("{\"mode\": \"fleet\", \"error\": \"--ports names no port\"}\n");
        return 1;
    }
    char *filters = calloc((size_t)opt.conns, 48);
    G.queue = calloc((size_t)opt.conns + 1, sizeof *G.queue);
    G.rc_us = calloc(2 * (size_t)opt.conns + 1, sizeof *G.rc_us);
    if (!filters || !G.queue || !G.rc_us) die("out of memory");
    for (long i = 0; i < opt.conns; i++) {
        int persistent = (long)((i + 1) * opt.persistent) > (long)(i * opt.persistent);
        char *f = NULL;
        if (persistent) {
            f = filters + i * 48;
            snprintf(f, 48, "%s/s/%ld", opt.prefix, i);
        }
        Conn *c = add_conn(ROLE_IDLE, !persistent, f);
        c->persistent = (uint8_t)persistent;
        c->port_i = (uint8_t)((i + opt.port_offset) % G.nports);
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = STDIN_TAG};
    epoll_ctl(G.ep, EPOLL_CTL_ADD, 0, &ev);
    double cpu0 = cpu_seconds();
    int complete = connect_all(0, G.nconns, deadline) && !G.failed && !G.suback_failures;
    uint64_t t1 = now_ns();
    double secs = (t1 - t_start) / 1e9;
    printf("{\"mode\": \"fleet\", \"complete\": %d, \"connect_s\": %.4f, \"connects_per_s\": %.1f, "
           "\"loadgen_cpu\": %.3f, ",
           complete, secs, G.connected / secs, (cpu_seconds() - cpu0) / secs);
    print_common();
    printf("}\n");
    fflush(stdout);
    G.reconnect = 1;
    uint64_t hold_end = t1 + (uint64_t)(opt.hold * 1e9), next_expire = t1;
    for (uint64_t now = t1; !G.quit && now < hold_end;) {
        fleet_pump(now);
        now = poll_once(G.qlen ? 2 : 20);
        if (now >= next_expire) {
            fleet_expire(now);
            next_expire = now + 500000000ULL;
        }
    }
    G.reconnect = 0;
    fleet_status("fleet-held");
    return 0;
}

/* ---- relay: a trivial QoS 0 "broker" that measures the generator's own ceiling ------------- */

/* Answers CONNECT and SUBSCRIBE and copies every PUBLISH byte for byte to every subscriber,
 * with no topic matching: what is left is the cost of the generator and the kernel. */
static void relay_packet(Conn *c, const uint8_t *raw, size_t len) {
    uint8_t kind = raw[0] >> 4;
    size_t hdr = 1;
    while (hdr < len && raw[hdr] & 128) hdr++;
    hdr++;
    if (kind == 1) { /* CONNECT */
        uint8_t *w = buf_put(&c->out, 4);
        w[0] = 0x20, w[1] = 2, w[2] = 0, w[3] = 0;
        c->state = ST_READY;
    } else if (kind == 8 && len >= hdr + 2) { /* SUBSCRIBE: grant QoS 0 */
        uint8_t *w = buf_put(&c->out, 5);
        w[0] = 0x90, w[1] = 3, w[2] = raw[hdr], w[3] = raw[hdr + 1], w[4] = 0;
        c->role = ROLE_SUB;
    } else if (kind == 3) {
        for (uint32_t i = 0; i < G.nconns; i++) {
            Conn *s = &G.conns[i];
            if (s->role == ROLE_SUB && s->state == ST_READY) memcpy(buf_put(&s->out, len), raw, len);
        }
    } else if (kind == 12) { /* PINGREQ */
        uint8_t *w = buf_put(&c->out, 2);
        w[0] = 0xd0, w[1] = 0;
    } else if (kind == 14) {
        conn_close(c, 0);
    }
}

static void relay_accept(void) {
    for (;;) {
        int fd = accept4(G.listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        if (G.nconns >= (uint32_t)opt.conns) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        Conn *c = add_conn(ROLE_PUB, 1, NULL);
        c->fd = fd;
        c->state = ST_WAIT_CONNACK;
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = c->idx};
        if (epoll_ctl(G.ep, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl add");
    }
}

static int run_relay(uint64_t deadline) {
    G.relay = 1;
    G.listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(G.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)opt.port)};
    inet_pton(AF_INET, opt.host, &addr.sin_addr);
    if (bind(G.listen_fd, (struct sockaddr *)&addr, sizeof addr) < 0) die("bind");
    if (listen(G.listen_fd, 1024) < 0) die("listen");
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = LISTEN_TAG};
    epoll_ctl(G.ep, EPOLL_CTL_ADD, G.listen_fd, &ev);
    printf("{\"mode\": \"relay\", \"listening\": %ld}\n", opt.port);
    fflush(stdout);
    while (poll_once(50) < deadline) {
        for (uint32_t i = 0; i < G.nconns; i++) {
            Conn *c = &G.conns[i];
            if (c->state != ST_CLOSED && buf_pending(&c->out) && !c->epout) conn_flush(c);
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    parse_args(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    G.ep = epoll_create1(EPOLL_CLOEXEC);
    if (G.ep < 0) die("epoll_create1");
    G.hist = calloc(HIST_US, sizeof(uint32_t));
    long total = opt.pubs + opt.subs + opt.conns + 4;
    G.conns = calloc((size_t)total, sizeof(Conn));
    if (!G.hist || !G.conns) die("out of memory");
    G.fan = 1;
    uint64_t t_start = now_ns(), deadline = t_start + (uint64_t)(opt.timeout * 1e9);
    int rc;
    if (!strcmp(opt.mode, "flow")) {
        opt.conns = 0;
        rc = run_flow(t_start, deadline);
    } else if (!strcmp(opt.mode, "conns")) {
        rc = run_conns(t_start, deadline);
    } else if (!strcmp(opt.mode, "retained")) {
        rc = run_retained(t_start, deadline);
    } else if (!strcmp(opt.mode, "relay")) {
        rc = run_relay(deadline);
    } else if (!strcmp(opt.mode, "session")) {
        rc = run_session(t_start, deadline);
    } else if (!strcmp(opt.mode, "fleet")) {
        rc = run_fleet(t_start, deadline);
    } else {
        fprintf(stderr, "loadgen: unknown mode %s\n", opt.mode);
        return 2;
    }
    fflush(stdout);
    for (uint32_t i = 0; i < G.nconns; i++) conn_close(&G.conns[i], 0);
    return rc;
}
