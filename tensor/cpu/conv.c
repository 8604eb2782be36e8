/* conv ops: being written. */
typedef int dg__placeholder_conv;
