/* Two MPI ranks: a ping-pong of 8-byte messages and a stream of 1 MiB
 * messages, every byte checked. Prints the half round trip and the stream's
 * bandwidth; exits non-zero on any mismatch. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ROUNDS = 2000, BIG = 1 << 20, STREAM = 200 };

static void fill(unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(seed * 31u + i * 7u);
}

static int check(const unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != (unsigned char)(seed * 31u + i * 7u))
			return 0;
	return 1;
}

int main(int argc, char **argv)
{
	int rank, size, bad = 0;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size != 2) {
		fprintf(stderr, "run with two ranks\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	int peer = 1 - rank;
	unsigned char small[8], *big = malloc(BIG);

	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = MPI_Wtime();
	for (unsigned r = 0; r < ROUNDS; r++) {
		if (rank == 0) {
			fill(small, 8, r);
			MPI_Send(small, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
			MPI_Recv(small, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			bad |= !check(small, 8, r + 1);
		} else {
			MPI_Recv(small, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			bad |= !check(small, 8, r);
			fill(small, 8, r + 1);
			MPI_Send(small, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
		}
	}
	double lat = (MPI_Wtime() - t0) / ROUNDS / 2 * 1e6;

	MPI_Barrier(MPI_COMM_WORLD);
	t0 = MPI_Wtime();
	for (unsigned m = 0; m < STREAM; m++) {
		if (rank == 0) {
			fill(big, BIG, m);
			MPI_Send(big, BIG, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
		} else {
			MPI_Recv(big, BIG, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			bad |= !check(big, BIG, m);
		}
	}
	char done = 0;
	if (rank == 1)
		MPI_Send(&done, 1, MPI_BYTE, peer, 3, MPI_COMM_WORLD);
	else
		MPI_Recv(&done, 1, MPI_BYTE, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
	double bw = (double)BIG * STREAM / (MPI_Wtime() - t0) / 1e6;

	int any = 0;
	MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
	if (rank == 0)
		printf("8 B half round trip %.2f us, 1 MiB stream %.0f MB/s, data %s\n", lat, bw,
		       any ? "CORRUPT" : "checked");
	free(big);
	MPI_Finalize();
	return any ? 1 : 0;
}
