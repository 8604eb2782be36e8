/* dropout ops: being written. */
typedef int dg__placeholder_dropout;
