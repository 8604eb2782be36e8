/* embedding ops: being written. */
typedef int dg__placeholder_embedding;
