/* Edge cases and errors across the wire, between two hosts: one program,
 * run as the server (the responder, which owns the memory) on one side and
 * as the client (the requester) on the other, so that each RoCE
 * implementation meets the other's.
 *
 *   wire-checks [-d DEVICE] [-g GID_INDEX] [-p PORT] [-m MTU] [-P PSN] TEST [SERVER]
 *
 * -P sets the first PSN of this side's send queue (random by default), so
 * that a run can start both sides just below the 24-bit wrap.
 *
 *   sizes      messages from 1 byte to 1 MiB (sizes around every power of
 *              two and the path MTU), each as a WRITE with immediate, a
 *              SEND and a READ, every byte checked where it lands, and the
 *              byte after it untouched; -m sets the path MTU (1024);
 *   zero       messages of no bytes: a SEND, a WRITE with immediate data and
 *              a READ, each with no scatter/gather entry: the server's
 *              receives complete with byte_len 0 (and the immediate), its
 *              memory unchanged, and the client's requests succeed;
 *   mw         a type 2 memory window the server binds over 256 bytes of its
 *              region: the client WRITEs through the window's R_Key, then
 *              invalidates it with SEND_WITH_INV (the server's receive says
 *              which key), then WRITEs through it again: IBV_WC_REM_ACCESS_ERR,
 *              and nothing of that last WRITE in the server's memory;
 *   bad-rkey   a WRITE with an R_Key the server never gave: the server NAKs
 *              it (remote access error) and the client's WRITE completes
 *              with IBV_WC_REM_ACCESS_ERR; the server's memory is unchanged
 *              and its QP is in the error state (IBTA class C);
 *   bad-va     the same with the right R_Key and a range that runs 32 bytes
 *              past the region's end;
 *   rnr        a SEND before the server has posted a receive: the server
 *              answers RNR NAKs naming 40.96 ms (min_rnr_timer 24) until it
 *              posts one, 300 ms later; the SEND completes, the data intact;
 *   rnr-exc    the same with no receive ever, rnr_retry 3: the client ends in
 *              IBV_WC_RNR_RETRY_EXC_ERR, and not before 3 x 40.96 ms, so it
 *              waited what the server's NAKs named;
 *   dead-peer  the server destroys its QP and exits after the exchange: the
 *              client's SEND, timeout 14 (67 ms) and retry_cnt 3, ends in
 *              IBV_WC_RETRY_EXC_ERR, and not before four timeouts.
 *
 * The sides exchange QPN, PSN, R_Key, address and GID over TCP, one text
 * line each way; the client tells the server when it is done. Exit 0 when
 * what happened is what the IBTA prescribes. */
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SIZE (4 << 20)
/* Where the sizes test puts things in a region. */
#define WRITE_AT 0
#define RECV_AT (5 << 18)  /* 1.25 MiB */
#define READ_AT (10 << 18) /* 2.5 MiB */
#define MAX_MSG (1 << 20)
#define PATTERN 0x5a
#define RNR_TIMER 24 /* 40.96 ms (IBTA table 45) */
#define RNR_TIMER_MS 40.96
#define TIMEOUT 14 /* 4.096 us x 2^14 = 67.1 ms */
#define TIMEOUT_MS 67.1

static const char *test;

static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stdout, "wire-checks %s: FAILED: ", test ? test : "");
	vfprintf(stdout, fmt, ap);
	fprintf(stdout, "\n");
	va_end(ap);
	exit(1);
}

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

struct dest {
	uint32_t qpn, psn, rkey;
	uint64_t addr;
	union ibv_gid gid;
};

static void put_dest(int fd, const struct dest *d)
{
	char line[128];
	int n = snprintf(line, sizeof line, "%06x %06x %08x %016llx ", d->qpn, d->psn, d->rkey,
			 (unsigned long long)d->addr);
	for (int i = 0; i < 16; i++)
		n += snprintf(line + n, sizeof line - n, "%02x", d->gid.raw[i]);
	line[n++] = '\n';
	if (write(fd, line, n) != n)
		fail("could not send the exchange: %s", strerror(errno));
}

/* One line from fd, waiting at most ms; NULL at end of stream. */
static char *get_line(int fd, char *buf, size_t len, int ms)
{
	size_t n = 0;
	while (n + 1 < len) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, ms) != 1)
			fail("no word from the peer within %d ms", ms);
		ssize_t r = read(fd, buf + n, 1);
		if (r <= 0)
			return NULL;
		if (buf[n] == '\n')
			break;
		n++;
	}
	buf[n] = 0;
	return buf;
}

static void get_dest(int fd, struct dest *d)
{
	char line[128], gid[33];
	unsigned long long addr;
	if (!get_line(fd, line, sizeof line, 30000) ||
	    sscanf(line, "%x %x %x %llx %32s", &d->qpn, &d->psn, &d->rkey, &addr, gid) != 5 ||
	    strlen(gid) != 32)
		fail("a malformed exchange from the peer");
	d->addr = addr;
	for (int i = 0; i < 16; i++) {
		unsigned v;
		sscanf(gid + 2 * i, "%2x", &v);
		d->gid.raw[i] = v;
	}
}

static int tcp_connect(const char *host, int port)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res;
	char service[8];
	snprintf(service, sizeof service, "%d", port);
	if (getaddrinfo(host, service, &hints, &res))
		fail("cannot resolve %s", host);
	int fd = socket(res->ai_family, res->ai_socktype, 0);
	if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen)) {
		/* the interop harness tries again on this message */
		printf("Couldn't connect to %s:%d\n", host, port);
		exit(1);
	}
	freeaddrinfo(res);
	return fd;
}

static int tcp_accept(int port)
{
	int one = 1, ls = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1))
		fail("cannot listen on port %d: %s", port, strerror(errno));
	int fd = accept(ls, NULL, NULL);
	if (fd < 0)
		fail("accept: %s", strerror(errno));
	close(ls);
	return fd;
}

static struct ibv_wc wait_wc(struct ibv_cq *cq, int ms)
{
	struct ibv_wc wc;
	double end = now_ms() + ms;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			fail("ibv_poll_cq failed");
		if (n == 1)
			return wc;
		if (now_ms() > end)
			fail("no completion within %d ms", ms);
		usleep(100);
	}
}

static const int sizes[] = { 1, 2, 3, 7, 8, 63, 64, 255, 256, 257, 1023, 1024, 1025, 2047, 2048,
			     2049, 4095, 4096, 4097, 8191, 8192, 8193, 65535, 65536, 65537,
			     262143, 262144, 262145, 1048575, 1048576 };
#define NSIZES (int)(sizeof sizes / sizeof sizes[0])

/* The bytes a message of n bytes carries, and what the server's READ
 * source holds. */
static unsigned char msg_byte(int i, int n) { return (i * 31 + n) & 0xff; }
static unsigned char src_byte(int i) { return (i * 7 + 13) & 0xff; }

/* Check that p holds a message of n bytes and that the byte after it is
 * still `after`. */
static void check_msg(const char *what, const unsigned char *p, int n, unsigned char after)
{
	for (int i = 0; i < n; i++)
		if (p[i] != msg_byte(i, n))
			fail("%s of %d bytes: byte %d is %#x, not %#x", what, n, i, p[i], msg_byte(i, n));
	if (p[n] != after)
		fail("%s of %d bytes: the byte after it changed to %#x", what, n, p[n]);
}

/* Post one work request and wait for its completion. */
static struct ibv_wc post_wait(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	if (ibv_post_send(qp, wr, &bad))
		fail("post_send: %s", strerror(errno));
	return wait_wc(cq, 30000);
}

/* Post a SEND and wait for its completion; *ms is how long that took. */
static struct ibv_wc timed_send(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_send_wr *wr, double *ms)
{
	wr->opcode = IBV_WR_SEND;
	double t0 = now_ms();
	struct ibv_wc wc = post_wait(qp, cq, wr);
	*ms = now_ms() - t0;
	return wc;
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia))
		fail("ibv_query_qp failed");
	return a.qp_state;
}

/* With -P, the PSN this side's QP stands at now (its send queue's for the
 * client, the requester; its receive queue's for the server) must have
 * passed 0xffffff: the run crossed the wrap. Both rxe and rnic report the
 * current PSNs in ibv_query_qp. */
static void check_wrapped(struct ibv_qp *qp, long first_psn, int client)
{
	if (first_psn < 0)
		return;
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(qp, &a, IBV_QP_SQ_PSN | IBV_QP_RQ_PSN, &ia))
		fail("ibv_query_qp failed");
	uint32_t now = client ? a.sq_psn : a.rq_psn;
	if (now >= (uint32_t)first_psn)
		fail("%s PSN went from %#lx to %#x: it never wrapped", client ? "send" : "receive", first_psn,
		     now);
	printf("wire-checks %s: %s PSNs from %#lx across the wrap to %#x\n", test, client ? "send" : "receive",
	       first_psn, now);
}

int main(int argc, char **argv)
{
	const char *devname = NULL;
	int gidx = 0, port = 18650, c;
	enum ibv_mtu mtu = IBV_MTU_1024;
	long first_psn = -1;
	while ((c = getopt(argc, argv, "d:g:p:m:P:")) != -1) {
		switch (c) {
		case 'm':
			switch (atoi(optarg)) {
			case 256: mtu = IBV_MTU_256; break;
			case 512: mtu = IBV_MTU_512; break;
			case 1024: mtu = IBV_MTU_1024; break;
			case 2048: mtu = IBV_MTU_2048; break;
			case 4096: mtu = IBV_MTU_4096; break;
			default: fprintf(stderr, "wire-checks: MTU 256, 512, 1024, 2048 or 4096\n"); return 2;
			}
			break;
		case 'd': devname = optarg; break;
		case 'g': gidx = atoi(optarg); break;
		case 'p': port = atoi(optarg); break;
		case 'P':
			first_psn = strtol(optarg, NULL, 0);
			if (first_psn < 0 || first_psn > 0xffffff) {
				fprintf(stderr, "wire-checks: a PSN is 0 to 0xffffff\n");
				return 2;
			}
			break;
		default: return 2;
		}
	}
	if (optind >= argc) {
		fprintf(stderr, "usage: wire-checks [-d DEVICE] [-g GID_INDEX] [-p PORT] [-m MTU] [-P PSN] TEST [SERVER]\n");
		return 2;
	}
	test = argv[optind];
	/* With a server to connect to, this side is the client. */
	const char *server = optind + 1 < argc ? argv[optind + 1] : NULL;
	int client = server != NULL;
	int is = !strcmp(test, "bad-rkey") ? 1 : !strcmp(test, "bad-va") ? 2 : !strcmp(test, "rnr") ? 3 :
		 !strcmp(test, "rnr-exc") ? 4 : !strcmp(test, "dead-peer") ? 5 : !strcmp(test, "zero") ? 6 : !strcmp(test, "mw") ? 7 : !strcmp(test, "sizes") ? 8 : 0;
	if (!is)
		fail("unknown test (sizes, zero, mw, bad-rkey, bad-va, rnr, rnr-exc, dead-peer)");

	struct ibv_device **list = ibv_get_device_list(NULL), *dev = NULL;
	for (int i = 0; list && list[i]; i++)
		if (!devname || !strcmp(ibv_get_device_name(list[i]), devname))
			dev = dev ? dev : list[i];
	if (!dev)
		fail("no device %s", devname ? devname : "");
	struct ibv_context *ctx = ibv_open_device(dev);
	if (!ctx)
		fail("cannot open %s", ibv_get_device_name(dev));
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	unsigned char *buf = aligned_alloc(4096, SIZE);
	memset(buf, client ? PATTERN : 0x11, SIZE);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, SIZE,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				       IBV_ACCESS_MW_BIND);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!pd || !mr || !cq)
		fail("cannot allocate a PD, region or CQ");
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		fail("cannot create a QP");

	srand48(getpid() ^ time(NULL));
	uint32_t psn = first_psn >= 0 ? (uint32_t)first_psn : lrand48() & 0xffffff;
	struct dest me = { .qpn = qp->qp_num, .psn = psn, .rkey = mr->rkey, .addr = (uintptr_t)buf }, peer;
	if (ibv_query_gid(ctx, 1, gidx, &me.gid))
		fail("no GID %d", gidx);
	int fd;
	if (client) {
		fd = tcp_connect(server, port);
		put_dest(fd, &me);
		get_dest(fd, &peer);
	} else {
		fd = tcp_accept(port);
		get_dest(fd, &peer);
		put_dest(fd, &me);
	}

	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		fail("INIT");
	struct ibv_qp_attr r = {
		.qp_state = IBV_QPS_RTR, .path_mtu = mtu, .dest_qp_num = peer.qpn,
		.rq_psn = peer.psn, .max_dest_rd_atomic = 1, .min_rnr_timer = RNR_TIMER,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = peer.gid, .sgid_index = gidx, .hop_limit = 64 } },
	};
	if (ibv_modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		fail("RTR");
	struct ibv_qp_attr s = { .qp_state = IBV_QPS_RTS, .timeout = TIMEOUT,
		.retry_cnt = is == 5 ? 3 : 7, .rnr_retry = is == 4 ? 3 : 7, .sq_psn = me.psn,
		.max_rd_atomic = 1 };
	if (ibv_modify_qp(qp, &s, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		fail("RTS");

	char line[128];
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad_rwr;
	struct ibv_send_wr swr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1,
				   .send_flags = IBV_SEND_SIGNALED }, *bad_swr;

	if (!client) {
		/* The server: the responder. */
		if (is == 1 || is == 2) {
			if (ibv_post_recv(qp, &rwr, &bad_rwr))
				fail("post_recv");
		}
		/* The client sends nothing before the server's QP is in RTS with
		 * its receive posted: a request that reached it in RTR (a bad one
		 * moves it to the error state) would make its move to RTS fail. */
		if (write(fd, "rts\n", 4) != 4)
			fail("could not tell the client");
		if (is == 5) {
			ibv_destroy_qp(qp);
			printf("wire-checks %s: server: QP destroyed, leaving\n", test);
			return 0;
		}
		if (is == 3) {
			usleep(300 * 1000);
			if (ibv_post_recv(qp, &rwr, &bad_rwr))
				fail("post_recv");
			struct ibv_wc wc = wait_wc(cq, 30000);
			if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.byte_len != 64)
				fail("the receive completed with %s, %u bytes",
				     ibv_wc_status_str(wc.status), wc.byte_len);
			for (int i = 0; i < 64; i++)
				if (buf[i] != PATTERN)
					fail("byte %d received is %#x", i, buf[i]);
		}
		if (is == 6) {
			for (int k = 0; k < 2; k++)
				if (ibv_post_recv(qp, &rwr, &bad_rwr))
					fail("post_recv");
			/* Tell the client the receives are there. */
			if (write(fd, "go\n", 3) != 3)
				fail("could not tell the client");
			struct ibv_wc wc = wait_wc(cq, 30000);
			if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.byte_len != 0)
				fail("the empty SEND arrived as %s, opcode %d, %u bytes",
				     ibv_wc_status_str(wc.status), wc.opcode, wc.byte_len);
			wc = wait_wc(cq, 30000);
			if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM ||
			    wc.byte_len != 0 || !(wc.wc_flags & IBV_WC_WITH_IMM) ||
			    ntohl(wc.imm_data) != 0x1234abcd)
				fail("the empty WRITE with immediate arrived as %s, opcode %d, %u bytes, imm %#x",
				     ibv_wc_status_str(wc.status), wc.opcode, wc.byte_len, ntohl(wc.imm_data));
		}
		if (is == 8) {
			for (int i = 0; i < MAX_MSG + 1; i++)
				buf[READ_AT + i] = src_byte(i);
			for (int k = 0; k < NSIZES; k++) {
				int n = sizes[k];
				if (!get_line(fd, line, sizeof line, 60000) || atoi(line) != n)
					fail("the client asked for something other than size %d", n);
				struct ibv_recv_wr imm = { .wr_id = 1 }, *bad;
				struct ibv_sge rs = { .addr = (uintptr_t)buf + RECV_AT, .length = MAX_MSG,
						      .lkey = mr->lkey };
				struct ibv_recv_wr snd = { .wr_id = 2, .sg_list = &rs, .num_sge = 1 };
				if (ibv_post_recv(qp, &imm, &bad) || ibv_post_recv(qp, &snd, &bad))
					fail("post_recv");
				if (write(fd, "ready\n", 6) != 6)
					fail("could not tell the client");
				for (int j = 0; j < 2; j++) {
					struct ibv_wc wc = wait_wc(cq, 30000);
					if (wc.status != IBV_WC_SUCCESS || wc.byte_len != (uint32_t)n)
						fail("receive %lu for %d bytes: %s, %u bytes", (unsigned long)wc.wr_id,
						     n, ibv_wc_status_str(wc.status), wc.byte_len);
					if (wc.wr_id == 1 && (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM ||
							      ntohl(wc.imm_data) != (uint32_t)n))
						fail("the WRITE of %d bytes: opcode %d, immediate %u", n, wc.opcode,
						     ntohl(wc.imm_data));
				}
				/* Sizes go up: the byte after this message is one no
				 * earlier message reached. */
				check_msg("WRITE", buf + WRITE_AT, n, 0x11);
				check_msg("SEND", buf + RECV_AT, n, 0x11);
				if (write(fd, "ok\n", 3) != 3)
					fail("could not tell the client");
			}
			/* The client's last READ may still be on the wire: stay until it
			 * says it is done. */
			if (!get_line(fd, line, sizeof line, 60000) || strcmp(line, "done"))
				fail("the client left without its last READ");
			for (int i = 0; i < MAX_MSG + 1; i++)
				if (buf[READ_AT + i] != src_byte(i))
					fail("the READ source changed at byte %d", i);
			check_wrapped(qp, first_psn, 0);
			printf("wire-checks sizes: server: %d WRITEs with immediate and %d SENDs, 1 B to 1 MiB, every byte right\n",
			       NSIZES, NSIZES);
			return 0;
		}
		uint32_t window = 0;
		if (is == 7) {
			struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
			if (!mw)
				fail("ibv_alloc_mw: %s", strerror(errno));
			window = ibv_inc_rkey(mw->rkey);
			struct ibv_send_wr bind = { .wr_id = 3, .opcode = IBV_WR_BIND_MW,
				.send_flags = IBV_SEND_SIGNALED,
				.bind_mw = { .mw = mw, .rkey = window,
					     .bind_info = { .mr = mr, .addr = (uintptr_t)buf, .length = 256,
							    .mw_access_flags = IBV_ACCESS_REMOTE_WRITE } } };
			struct ibv_wc wc = post_wait(qp, cq, &bind);
			if (wc.wr_id != 3 || wc.status != IBV_WC_SUCCESS)
				fail("the bind completed with %s", ibv_wc_status_str(wc.status));
			if (ibv_post_recv(qp, &rwr, &bad_rwr))
				fail("post_recv");
			char w[32];
			int n = snprintf(w, sizeof w, "%08x\n", window);
			if (write(fd, w, n) != n)
				fail("could not send the window's key");
			wc = wait_wc(cq, 30000);
			/* rdma_rxe (Linux 6.1, rdma-core 44) sets the kernel's
			 * IB_WC_WITH_INVALIDATE, 1 << 2, which user space reads as
			 * IBV_WC_IP_CSUM_OK; IBV_WC_WITH_INV is 1 << 3. Taken from rxe
			 * only, and said. */
			int rxe = !strncmp(ibv_get_device_name(dev), "rxe", 3);
			int inv = wc.wc_flags & IBV_WC_WITH_INV;
			if (!inv && rxe && (wc.wc_flags & IBV_WC_IP_CSUM_OK)) {
				printf("wire-checks mw: server: rxe flags the invalidation as %#x, IBV_WC_IP_CSUM_OK (its kernel's IB_WC_WITH_INVALIDATE)\n",
				       wc.wc_flags);
				inv = 1;
			}
			if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || !inv ||
			    wc.invalidated_rkey != window)
				fail("the SEND_WITH_INV arrived as %s, opcode %d, flags %#x, invalidated %#x (window %#x)",
				     ibv_wc_status_str(wc.status), wc.opcode, wc.wc_flags, wc.invalidated_rkey,
				     window);
		}
		if (!get_line(fd, line, sizeof line, 60000))
			fail("the client left without a word");
		if (strcmp(line, "done"))
			fail("the client says: %s", line);
		if (is == 1 || is == 2 || is == 6) {
			for (int i = 0; i < SIZE; i++)
				if (buf[i] != 0x11)
					fail("byte %d of the region changed to %#x", i, buf[i]);
		}
		if (is == 7) {
			/* The first WRITE's 64 bytes, nothing of the second. */
			for (int i = 0; i < SIZE; i++)
				if (buf[i] != (i < 64 ? PATTERN : 0x11))
					fail("byte %d of the region is %#x", i, buf[i]);
			if (qp_state(qp) != IBV_QPS_ERR)
				fail("the QP is in state %d after the access error", qp_state(qp));
			printf("wire-checks mw: server: window %#x written, invalidated by the SEND, then refused\n",
			       window);
			return 0;
		}
		if (is == 1 || is == 2) {
			if (qp_state(qp) != IBV_QPS_ERR)
				fail("the QP is in state %d after the access error, not IBV_QPS_ERR",
				     qp_state(qp));
			struct ibv_wc wc = wait_wc(cq, 5000);
			if (wc.wr_id != 7 || wc.status != IBV_WC_WR_FLUSH_ERR)
				fail("the posted receive completed with %s, not flushed",
				     ibv_wc_status_str(wc.status));
			printf("wire-checks %s: server: memory unchanged, QP in error, receive flushed\n", test);
		} else if (is == 6) {
			printf("wire-checks zero: server: both receives of 0 bytes, memory unchanged\n");
		} else {
			printf("wire-checks %s: server: ok\n", test);
		}
		return 0;
	}

	/* The client: the requester, once the server is ready. */
	if (!get_line(fd, line, sizeof line, 30000) || strcmp(line, "rts"))
		fail("the server did not reach RTS");
	double ms;
	struct ibv_wc wc;
	switch (is) {
	case 8:
		for (int k = 0; k < NSIZES; k++) {
			int n = sizes[k];
			for (int i = 0; i < n; i++)
				buf[i] = msg_byte(i, n);
			char ask[32];
			int len = snprintf(ask, sizeof ask, "%d\n", n);
			if (write(fd, ask, len) != len)
				fail("could not ask the server");
			if (!get_line(fd, line, sizeof line, 60000) || strcmp(line, "ready"))
				fail("the server is not ready for %d bytes", n);
			struct ibv_sge out = { .addr = (uintptr_t)buf, .length = n, .lkey = mr->lkey };
			struct ibv_sge in = { .addr = (uintptr_t)buf + READ_AT, .length = n, .lkey = mr->lkey };
			struct ibv_send_wr rd = { .wr_id = 3, .sg_list = &in, .num_sge = 1,
				.opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
				.wr.rdma = { .remote_addr = peer.addr + READ_AT, .rkey = peer.rkey } };
			struct ibv_send_wr sd = { .wr_id = 2, .sg_list = &out, .num_sge = 1,
				.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED, .next = &rd };
			struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &out, .num_sge = 1,
				.opcode = IBV_WR_RDMA_WRITE_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
				.imm_data = htonl(n), .next = &sd,
				.wr.rdma = { .remote_addr = peer.addr + WRITE_AT, .rkey = peer.rkey } };
			memset(buf + READ_AT, 0x22, MAX_MSG + 1);
			if (ibv_post_send(qp, &wr, &bad_swr))
				fail("post_send");
			for (int j = 0; j < 3; j++) {
				wc = wait_wc(cq, 30000);
				if (wc.status != IBV_WC_SUCCESS)
					fail("request %lu of %d bytes: %s", (unsigned long)wc.wr_id, n,
					     ibv_wc_status_str(wc.status));
			}
			for (int i = 0; i < n; i++)
				if (buf[READ_AT + i] != src_byte(i))
					fail("READ of %d bytes: byte %d is %#x, not %#x", n, i, buf[READ_AT + i],
					     src_byte(i));
			if (buf[READ_AT + n] != 0x22)
				fail("READ of %d bytes: the byte after it changed", n);
			if (!get_line(fd, line, sizeof line, 60000) || strcmp(line, "ok"))
				fail("the server found the %d-byte messages wrong", n);
		}
		if (write(fd, "done\n", 5) != 5)
			fail("could not tell the server");
		check_wrapped(qp, first_psn, 1);
		printf("wire-checks sizes: client: %d READs, 1 B to 1 MiB, every byte right\n", NSIZES);
		return 0;
	case 6:
		if (!get_line(fd, line, sizeof line, 30000) || strcmp(line, "go"))
			fail("the server did not post its receives");
		swr.num_sge = 0;
		swr.opcode = IBV_WR_SEND;
		if (ibv_post_send(qp, &swr, &bad_swr))
			fail("post_send");
		swr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		swr.imm_data = htonl(0x1234abcd);
		swr.wr.rdma.rkey = peer.rkey;
		swr.wr.rdma.remote_addr = peer.addr;
		if (ibv_post_send(qp, &swr, &bad_swr))
			fail("post_send");
		swr.opcode = IBV_WR_RDMA_READ;
		if (ibv_post_send(qp, &swr, &bad_swr))
			fail("post_send");
		for (int k = 0; k < 3; k++) {
			wc = wait_wc(cq, 30000);
			if (wc.status != IBV_WC_SUCCESS || wc.byte_len != 0)
				fail("request %d of no bytes completed with %s, %u bytes", k,
				     ibv_wc_status_str(wc.status), wc.byte_len);
		}
		for (int i = 0; i < SIZE; i++)
			if (buf[i] != PATTERN)
				fail("byte %d of the client's region changed to %#x", i, buf[i]);
		printf("wire-checks zero: client: SEND, WRITE with immediate and READ of 0 bytes completed\n");
		break;
	case 7: {
		uint32_t window;
		if (!get_line(fd, line, sizeof line, 30000) || sscanf(line, "%x", &window) != 1)
			fail("no window key from the server");
		swr.opcode = IBV_WR_RDMA_WRITE;
		swr.wr.rdma.rkey = window;
		swr.wr.rdma.remote_addr = peer.addr;
		wc = post_wait(qp, cq, &swr);
		if (wc.status != IBV_WC_SUCCESS)
			fail("the WRITE through the window completed with %s", ibv_wc_status_str(wc.status));
		swr.opcode = IBV_WR_SEND_WITH_INV;
		swr.invalidate_rkey = window;
		wc = post_wait(qp, cq, &swr);
		if (wc.status != IBV_WC_SUCCESS)
			fail("the SEND_WITH_INV completed with %s", ibv_wc_status_str(wc.status));
		swr.opcode = IBV_WR_RDMA_WRITE;
		memset(buf, 0x77, 64);
		wc = post_wait(qp, cq, &swr);
		if (wc.status != IBV_WC_REM_ACCESS_ERR)
			fail("the WRITE through the invalidated window completed with %s",
			     ibv_wc_status_str(wc.status));
		printf("wire-checks mw: client: WRITE through window %#x, SEND_WITH_INV, then IBV_WC_REM_ACCESS_ERR\n",
		       window);
		break;
	}
	case 1:
	case 2:
		swr.opcode = IBV_WR_RDMA_WRITE;
		swr.wr.rdma.rkey = is == 1 ? peer.rkey ^ 0x1 : peer.rkey;
		swr.wr.rdma.remote_addr = is == 1 ? peer.addr : peer.addr + SIZE - 32;
		wc = post_wait(qp, cq, &swr);
		if (wc.status != IBV_WC_REM_ACCESS_ERR)
			fail("the WRITE completed with %s, not IBV_WC_REM_ACCESS_ERR",
			     ibv_wc_status_str(wc.status));
		printf("wire-checks %s: client: IBV_WC_REM_ACCESS_ERR\n", test);
		break;
	case 3:
	case 4:
		wc = timed_send(qp, cq, &swr, &ms);
		if (is == 3 && wc.status != IBV_WC_SUCCESS)
			fail("the SEND completed with %s after %.1f ms", ibv_wc_status_str(wc.status), ms);
		if (is == 4 && wc.status != IBV_WC_RNR_RETRY_EXC_ERR)
			fail("the SEND completed with %s, not IBV_WC_RNR_RETRY_EXC_ERR",
			     ibv_wc_status_str(wc.status));
		/* Three retries, each after the NAK's timer: not sooner. (Kernel
		 * timers round down to a tick at most; allow 10%.) */
		if (is == 4 && ms < 3 * RNR_TIMER_MS * 0.9)
			fail("RNR_RETRY_EXC_ERR after %.1f ms: the NAKs' %.2f ms were not waited",
			     ms, RNR_TIMER_MS);
		printf("wire-checks %s: client: %s after %.1f ms\n", test, ibv_wc_status_str(wc.status), ms);
		break;
	case 5:
		/* Wait for the server to be gone. */
		if (get_line(fd, line, sizeof line, 30000))
			fail("the server said %s instead of leaving", line);
		usleep(100 * 1000);
		wc = timed_send(qp, cq, &swr, &ms);
		if (wc.status != IBV_WC_RETRY_EXC_ERR)
			fail("the SEND completed with %s, not IBV_WC_RETRY_EXC_ERR",
			     ibv_wc_status_str(wc.status));
		if (ms < 4 * TIMEOUT_MS * 0.9)
			fail("IBV_WC_RETRY_EXC_ERR after %.1f ms, before four timeouts of %.1f ms",
			     ms, TIMEOUT_MS);
		printf("wire-checks %s: client: IBV_WC_RETRY_EXC_ERR after %.1f ms\n", test, ms);
		return 0;
	}
	if (write(fd, "done\n", 5) != 5)
		fail("could not tell the server");
	/* The server checks its side before it closes. */
	get_line(fd, line, sizeof line, 60000);
	return 0;
}
