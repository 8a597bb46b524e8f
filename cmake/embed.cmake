# Writes the bytes of IN as a C array into OUT (cmake -DIN=... -DOUT=...
# -DNAME=... -DHEADER=... -P embed.cmake), so that a text file of the
# repository (the OpenAPI document) is part of the binary without a copy
# kept by hand in C.  The array gets a terminating NUL that NAME_len does
# not count.
file(READ "${IN}" hex HEX)
get_filename_component(base "${IN}" NAME)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," arr "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)"
       "\\1\n" arr "${arr}")
file(WRITE "${OUT}.tmp"
     "/* Generated from ${base} by cmake/embed.cmake; do not edit. */\n"
     "#include \"${HEADER}\"\n"
     "const unsigned char ${NAME}[] = {\n${arr}0x00};\n"
     "const size_t ${NAME}_len = ${len};\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
