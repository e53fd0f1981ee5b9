/* The pool socket: connecting, the hello and its descriptors (SCM_RIGHTS), version 2
 * frames, and finding a node's socket (docs/HANDOFF.md, "Socket", "Hello", "The socket
 * protocol (version 2)"). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

int vp_socket_connect(const char *path) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) return vp_fail("socket path %s is too long", path);
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return vp_fail("socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        int e = errno;
        close(fd);
        return vp_fail("connecting to %s: %s", path, strerror(e));
    }
    return fd;
}

/* recvmsg into buf, the descriptors of its SCM_RIGHTS into fds. Bytes read, 0 at the end,
 * -1 on error. */
static ssize_t recv_fds(int fd, void *buf, size_t len, int *fds, int *nfds) {
    union {
        struct cmsghdr align;
        char space[CMSG_SPACE(sizeof(int) * VP_MAX_FDS)];
    } control;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space,
                         .msg_controllen = sizeof control.space};
    ssize_t n;
    do n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); n >= 0 && c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        int count = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < count; i++) {
            int got;
            memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (*nfds < VP_MAX_FDS) fds[(*nfds)++] = got;
            else close(got);
        }
    }
    return n;
}

static int read_all(int fd, uint8_t *buf, size_t len, int *fds, int *nfds) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv_fds(fd, buf + got, len - got, fds, nfds);
        if (n < 0) return vp_fail("reading the hello: %s", strerror(errno));
        if (n == 0) return vp_fail("the node closed the connection before its hello");
        got += (size_t)n;
    }
    return VP_OK;
}

static long long number(const char *text, size_t len) {
    char buf[32];
    size_t n = len < sizeof buf - 1 ? len : sizeof buf - 1;
    memcpy(buf, text, n);
    buf[n] = 0;
    return strtoll(buf, NULL, 10);
}

typedef struct hello_parse {
    vp_hello *h;
    char magic[32], error[256];
    long long version;
} hello_parse;

static void copy_text(char *out, size_t cap, const char *text, size_t len) {
    size_t n = len < cap - 1 ? len : cap - 1;
    memcpy(out, text, n);
    out[n] = 0;
}

static void hello_field(const char *key, char kind, const char *text, size_t len, void *user) {
    hello_parse *p = user;
    vp_hello *h = p->h;
    struct { const char *name; long long *slot; } ints[] = {
        {"device_id", &h->device_id}, {"blocks", &h->blocks}, {"block_size", &h->block_size},
        {"control_size", &h->control_size}, {"row", &h->row}, {"rows", &h->rows},
        {"records_offset", &h->records_offset}, {"record_stride", &h->record_stride},
        {"holds_offset", &h->holds_offset}, {"row_stride", &h->row_stride}, {"version", &p->version}};
    if (kind == 'n') {
        for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
            if (strcmp(key, ints[i].name) == 0) *ints[i].slot = number(text, len);
    } else if (kind == 's') {
        if (strcmp(key, "magic") == 0) copy_text(p->magic, sizeof p->magic, text, len);
        if (strcmp(key, "error") == 0) copy_text(p->error, sizeof p->error, text, len);
        if (strcmp(key, "pool_id") == 0) copy_text(h->pool_id, sizeof h->pool_id, text, len);
        if (strcmp(key, "memory") == 0) copy_text(h->memory, sizeof h->memory, text, len);
    } else if (kind == 'a' && strcmp(key, "versions") == 0) {
        for (size_t i = 0; i < len; i++)
            if (text[i] == '2' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == ',') &&
                (i + 1 == len || text[i + 1] == ',' || text[i + 1] == ' '))
                h->speaks_v2 = 1;
    }
}

/* The layout rules a consumer relies on (as the Python consumer's Hello._check_layout). */
static int check_layout(const vp_hello *h) {
    if (strcmp(h->memory, "host") != 0 && strcmp(h->memory, "cuda") != 0)
        return vp_fail("hello: memory \"%s\" is neither \"host\" nor \"cuda\"", h->memory);
    if (h->blocks < 1 || h->block_size < 1 || h->blocks > VP_MAX_FDS - 1) return vp_fail("hello: no blocks");
    if (h->row < 0 || h->row >= h->rows) return vp_fail("hello: row %lld outside 0..%lld", h->row, h->rows - 1);
    if (h->records_offset < 8 || h->records_offset % 8 || h->record_stride < 8 || h->record_stride % 8 ||
        h->records_offset + h->blocks * h->record_stride > h->control_size)
        return vp_fail("hello: the records do not fit the control block");
    if (h->holds_offset % 4 || h->row_stride % 4 || h->row_stride < 4 * h->blocks ||
        h->holds_offset + h->rows * h->row_stride > h->control_size)
        return vp_fail("hello: the rows do not fit the control block");
    if (strcmp(h->memory, "cuda") == 0 && h->device_id < 0)
        return vp_fail("hello: memory \"cuda\" on device %lld: not a CUDA ordinal", h->device_id);
    return VP_OK;
}

int vp_read_hello(int fd, vp_hello *hello, int *fds, int *nfds) {
    uint8_t len4[4];
    memset(hello, 0, sizeof *hello);
    *nfds = 0;
    if (read_all(fd, len4, 4, fds, nfds) != VP_OK) return VP_ERROR;
    uint32_t len = len4[0] | len4[1] << 8 | len4[2] << 16 | (uint32_t)len4[3] << 24;
    if (len == 0 || len > VP_MAX_HELLO) return vp_fail("a hello of %u bytes is not a hello", len);
    char *json = malloc(len);
    if (!json) return vp_fail("out of memory");
    int rc = read_all(fd, (uint8_t *)json, len, fds, nfds);
    hello_parse p = {.h = hello, .version = -1};
    hello->device_id = -1;
    if (rc == VP_OK && vp_json_object(json, len, hello_field, &p) != 0) rc = vp_fail("the hello is not a JSON object");
    free(json);
    if (rc != VP_OK) return rc;
    if (strcmp(p.magic, VP_HELLO_MAGIC) != 0 || p.version != VP_HELLO_VERSION)
        return vp_fail("not a vision_preproc pool of hello version %d (magic \"%s\", version %lld)",
                       VP_HELLO_VERSION, p.magic, p.version);
    if (p.error[0]) return vp_fail("the node refused the connection: %s", p.error);
    if (check_layout(hello) != VP_OK) return VP_ERROR;
    if (*nfds != hello->blocks + 1)
        return vp_fail("the hello came with %d descriptors for %lld blocks and the control block", *nfds,
                       hello->blocks);
    return VP_OK;
}

int vp_send_frame(int fd, uint16_t type, const void *body, size_t len) {
    uint8_t head[8];
    uint32_t n = (uint32_t)len + 4;
    for (int i = 0; i < 4; i++) head[i] = (uint8_t)(n >> (8 * i));
    head[4] = (uint8_t)type, head[5] = (uint8_t)(type >> 8), head[6] = head[7] = 0;
    struct iovec iov[2] = {{head, 8}, {(void *)body, len}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
    size_t want = 8 + len;
    ssize_t sent;
    do sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    if (sent != (ssize_t)want) return vp_fail("sending to the node: %s", sent < 0 ? strerror(errno) : "short write");
    return VP_OK;
}

static int64_t monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A whole frame at the start of c->rbuf: its total length, 0 if incomplete, -1 if bad. */
static long whole_frame(const vp_consumer *c) {
    if (c->rlen < 8) return 0;
    const uint8_t *b = c->rbuf;
    uint32_t n = b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24;
    if (n < 4 || n > VP_MAX_FRAME) return -1;
    return c->rlen >= 4 + (size_t)n ? (long)(4 + n) : 0;
}

int vp_recv_frame(vp_consumer *c, int timeout_ms, uint16_t *type, const uint8_t **body, size_t *len) {
    if (c->consumed) { /* the frame handed out last time, dropped now */
        memmove(c->rbuf, c->rbuf + c->consumed, c->rlen - c->consumed);
        c->rlen -= c->consumed;
        c->consumed = 0;
    }
    int64_t deadline = timeout_ms < 0 ? -1 : monotonic_ms() + timeout_ms;
    for (;;) {
        long whole = whole_frame(c);
        if (whole < 0) return vp_fail("the node sent a frame of a bad length");
        if (whole > 0) {
            *type = (uint16_t)(c->rbuf[4] | c->rbuf[5] << 8);
            *body = c->rbuf + 8;
            *len = (size_t)whole - 8;
            c->consumed = (size_t)whole;
            return VP_OK;
        }
        int wait = deadline < 0 ? -1 : (int)(deadline - monotonic_ms());
        if (deadline >= 0 && wait < 0) wait = 0;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int r = poll(&p, 1, wait);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return vp_fail("poll: %s", strerror(errno));
        if (r == 0) return VP_TIMEOUT;
        ssize_t n = recv(c->fd, c->rbuf + c->rlen, VP_MAX_FRAME + 8 - c->rlen, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0) return vp_fail("reading from the node: %s", strerror(errno));
        if (n == 0) return VP_CLOSED;
        c->rlen += (size_t)n;
    }
}

int vp_connected(const vp_consumer *c) {
    struct pollfd p = {.fd = c->fd, .events = POLLRDHUP};
    return !(poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)));
}

/* The node's socket directory (docs/HANDOFF.md, "Socket"). */
static void socket_dir(char *out, size_t len) {
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && *xdg) snprintf(out, len, "%s/vision_preproc", xdg);
    else snprintf(out, len, "/tmp/vision_preproc-%u", (unsigned)getuid());
}

int vp_find_socket(char *path, size_t len) {
    char dir[200];
    socket_dir(dir, sizeof dir);
    DIR *d = opendir(dir);
    if (!d) return vp_fail("no node's socket directory %s: %s (is the node running, as this user?)", dir,
                           strerror(errno));
    struct timespec newest = {0, 0};
    int found = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".sock") != 0) continue;
        char p[512];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        int newer = st.st_mtim.tv_sec > newest.tv_sec ||
                    (st.st_mtim.tv_sec == newest.tv_sec && st.st_mtim.tv_nsec > newest.tv_nsec);
        if (!found || newer) {
            newest = st.st_mtim;
            snprintf(path, len, "%s", p);
            found = 1;
        }
    }
    closedir(d);
    return found ? VP_OK : vp_fail("no pool socket in %s (is the node running with shared_pool_size > 0?)", dir);
}
